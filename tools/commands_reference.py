#!/usr/bin/env python3
"""Write docs/reference/commands.md from the command line's own help.

Usage: python tools/commands_reference.py [--check]

The page lists every command with the first paragraph of its help and its options, as
``guardctl --help`` gives them; tests/foundation/test_operator_docs.py fails when the page and
the command line differ, and this script (without ``--check``) writes the page again.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from guardctl.cli import main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "commands.md"

HEAD = """\
# Command reference

The full reference of every command, option and exit code is the manual page guardctl(1),
generated from the code (a test keeps `man/guardctl.1` in step with it): `guardctl man` shows it
after any installation, `man -l man/guardctl.1` from a checkout, and `guardctl COMMAND --help`
prints one command's help. This table lists each command with the first paragraph of its help
and its options, as `guardctl --help` gives them (`python tools/commands_reference.py` writes it).

Options of every command (before the command's name): `--config FILE` (a TOML file read after
/etc/guardctl, repeatable), `--set SECTION.KEY=VALUE` (one setting, repeatable), `--version`,
`--debug` (show the traceback of an internal error). Node sets use Slurm's hostlist syntax
(`node[1-4,7]`). Every read command has `--json`; every acting command has `--dry-run`.

| command | what it does | options |
|---|---|---|
"""

TAIL = """
Exit codes, the same for every command: 0 ok, 1 findings (something to act on), 2 usage,
3 configuration, 4 a Slurm command failed, 5 Slurm timed out or its controller is down,
6 refused by a safety rule, 7 bad input data, 8 the store not writable, 70 internal error. What
each means and what to do: docs/operate/troubleshoot.md.
"""


def row(command: click.Command, words: list[str]) -> str:
    """One table row: the command with its arguments, its help's first paragraph, its options."""
    summary = re.sub(r"\s+", " ", (command.help or "").strip().split("\n\n")[0])
    options = [
        name
        for p in command.params
        if isinstance(p, click.Option)
        for name in p.opts
        if name.startswith("--") and name != "--help"
    ]
    arguments = [p.human_readable_name for p in command.params if isinstance(p, click.Argument)]
    usage = " ".join(["guardctl", *words, *arguments])
    listed = ", ".join(f"`{o}`" for o in options) or "-"
    return f"| `{usage}` | {summary.replace('|', chr(92) + '|')} | {listed} |"


def rows(command: click.Command, words: list[str]) -> list[str]:
    """Every command under *command*, in name order; a group that runs by itself counts too."""
    if not isinstance(command, click.Group):
        return [row(command, words)]
    out = [row(command, words)] if words and command.invoke_without_command else []
    for name in sorted(command.commands):
        out += rows(command.commands[name], [*words, name])
    return out


def page() -> str:
    return HEAD + "\n".join(rows(main, [])) + "\n" + TAIL


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if PAGE.read_text() == page() else 1)
    PAGE.write_text(page())
