"""The man pages are generated from the CLI and the settings, and render cleanly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from guardctl import manpage

MAN = Path(__file__).parent.parent.parent / "man"


@pytest.mark.parametrize("name", sorted(manpage.pages()))
def test_committed_page_matches_the_code(name: str) -> None:
    assert (MAN / name).read_text() == manpage.pages()[name], (
        f"man/{name} is out of date: run `python -m guardctl.manpage man/`"
    )


def test_every_command_and_setting_is_documented() -> None:
    from guardctl.cli import main

    page = manpage.pages()["guardctl.1"]
    for name in main.list_commands(None):  # type: ignore[arg-type]
        assert f"guardctl {name}" in page.replace("\\-", "-")
    assert all(f".TP\n\\fB{int(c)}\\fR" in page for c in manpage.EXIT_CODES)


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
@pytest.mark.parametrize("name", sorted(p.name for p in MAN.glob("*.[0-9]")))
def test_man_renders_without_warnings(name: str) -> None:
    proc = subprocess.run(
        ["man", "--warnings", "-l", str(MAN / name)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "MAN_KEEP_FORMATTING": "0"},
    )
    assert proc.returncode == 0 and proc.stdout.strip()
    assert proc.stderr.strip() == "", proc.stderr
