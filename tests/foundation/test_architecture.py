"""Rules of the code base that a reviewer would otherwise have to remember."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "guardctl"
# Where each kind of process may be started (ruff's TID251 enforces it; this keeps it exact).
SANCTIONED = {
    "guardctl/runner.py": {"subprocess"},
    "guardctl/analyze/load.py": {"concurrent.futures.ProcessPoolExecutor"},
    "guardctl/dds/store.py": {"multiprocessing"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_runner_starts_processes() -> None:
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name != "runner.py" and {"subprocess", "os.system"} & imported_modules(path)
    ]
    assert offenders == []


def test_no_shell_anywhere() -> None:
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "shell=True" not in text, path
        assert "os.system(" not in text and "os.popen(" not in text, path


def test_every_module_says_what_it_is_for() -> None:
    missing = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None]
    assert missing == []


def process_apis(path: Path) -> set[str]:
    """The process-starting modules or names *path* imports (multiprocessing.connection is not)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in ("subprocess", "multiprocessing"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in ("subprocess", "multiprocessing"):
                found.add(node.module)
            if node.module == "concurrent.futures" and any(
                    a.name == "ProcessPoolExecutor" for a in node.names):
                found.add("concurrent.futures.ProcessPoolExecutor")
    return found


def test_processes_start_only_in_their_sanctioned_place() -> None:
    used = {}
    for top in ("guardctl", "sweeps", "tools"):
        for path in (ROOT / top).rglob("*.py"):
            apis = process_apis(path)
            if apis:
                used[str(path.relative_to(ROOT))] = apis
    assert used == SANCTIONED


def test_ruff_bans_them_everywhere_else() -> None:
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "TID251" in lint["select"]
    banned = set(lint["flake8-tidy-imports"]["banned-api"])
    assert {"subprocess", "os.system", "concurrent.futures.ProcessPoolExecutor",
            "multiprocessing.get_context", "multiprocessing.Pool"} <= banned
    exempt = {f for f, rules in lint["per-file-ignores"].items() if "TID251" in rules}
    assert exempt == set(SANCTIONED) | {"tests/*", "bench/*"}
