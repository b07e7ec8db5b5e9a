"""Rules of the code base that a reviewer would otherwise have to remember."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
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
    missing = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
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
                a.name == "ProcessPoolExecutor" for a in node.names
            ):
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
    assert {
        "subprocess",
        "os.system",
        "concurrent.futures.ProcessPoolExecutor",
        "multiprocessing.get_context",
        "multiprocessing.Pool",
    } <= banned
    exempt = {f for f, rules in lint["per-file-ignores"].items() if "TID251" in rules}
    assert exempt == set(SANCTIONED) | {"tests/*", "bench/*"}


# The modules outside the core: the command line, its entry point, and the generator of its manual.
NOT_CORE = {"cli", "__main__", "manpage"}


def import_contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts: list[dict[str, object]] = config["contracts"]
    return contracts


def test_the_import_contracts_hold() -> None:
    """import-linter over the package: each contract in pyproject.toml is kept."""
    lint = shutil.which("lint-imports")
    assert lint, "import-linter is a dev dependency: pip install -e '.[dev]'"
    proc = subprocess.run(
        [lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_the_contracts_say_what_the_rules_say() -> None:
    rules = {
        (tuple(c["source_modules"]), tuple(c["forbidden_modules"]))  # type: ignore[arg-type]
        for c in import_contracts()
        if c["type"] == "forbidden"
    }
    assert (("guardctl.probe", "guardctl.telemetry"), ("guardctl.analyze",)) in rules
    assert (
        ("guardctl.analyze",),
        ("guardctl.controller", "guardctl.sweep", "guardctl.nodeops", "guardctl.slurm"),
    ) in rules
    assert (("guardctl.sources.slurm_jobs",), ("guardctl.sources.prometheus",)) in rules


def test_every_core_module_is_under_the_no_cli_contract() -> None:
    """A new top-level module is core unless named in NOT_CORE: it cannot slip past the rule."""
    (core,) = [c for c in import_contracts() if c["forbidden_modules"] == ["guardctl.cli"]]
    top = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert set(core["source_modules"]) == {f"guardctl.{m}" for m in top - NOT_CORE}  # type: ignore[arg-type]


def test_the_probe_imports_only_the_standard_library() -> None:
    """The probe runs inside every training rank: nothing it loads may need installing."""
    code = (
        "import sys; before = set(sys.modules); import guardctl.probe; "
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    # _sysconfigdata_*: the standard library's sysconfig, named after the platform.
    loaded = {m for m in proc.stdout.split() if not m.startswith("_sysconfigdata_")}
    assert "guardctl" in loaded
    # orjson: the column mirror's faster decoder where it is installed, json where it is not.
    assert loaded - set(sys.stdlib_module_names) - {"guardctl", "orjson"} == set()
