"""Rules of the code base that a reviewer would otherwise have to remember."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "guardctl"


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
