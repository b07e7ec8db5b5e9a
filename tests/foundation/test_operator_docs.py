"""The operator's documentation names only commands and options that exist.

docs/operate/ and docs/reference/commands.md are what an administrator follows without reading
the code: a renamed command or option must fail here, not on a cluster.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import click

from guardctl.cli import main
from guardctl.config import Layer, build_settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    *sorted((ROOT / "docs" / "operate").glob("*.md")),
    ROOT / "docs" / "reference" / "commands.md",
    ROOT / "slurm" / "README.md",
]
TOOL = ROOT / "tools" / "commands_reference.py"
# A command line ends at shell syntax or a comment; what follows is not guardctl's.
END = re.compile(r"\s(?:#|\||;|&&|>|<)|`")


def invocations(text: str) -> list[str]:
    """Every `guardctl ...` command line in a page: in code spans and in code blocks."""
    found = re.findall(r"`(guardctl [^`]+)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        found += [
            line.strip() for line in block.splitlines() if line.strip().startswith("guardctl ")
        ]
    return [END.split(" " + line)[0].strip() for line in found]


def check(line: str) -> str | None:
    """Why *line* is not a valid guardctl command line, or None (also for a quoted message,
    such as ``guardctl prolog: checks timed out``, which is not a command line)."""
    line = re.sub(r"\$\([^)]*\)", "X", line)  # a shell substitution stands for one word
    if "(" in line or re.search(r"\w:(\s|$)", line):
        return None
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        return None
    command: click.Command = main
    options = {o for p in main.params for o in p.opts} | {"-h", "--help"}
    for word in words:
        if word.startswith("-"):
            name = word.split("=")[0]
            if name not in options | {o for p in command.params for o in p.opts}:
                return f"{line!r}: {command.name} has no {name}"
        elif isinstance(command, click.Group):
            sub = command.commands.get(word)
            if sub is None:
                if word.isupper() or "/" in word or "[" in word:
                    return None  # a placeholder (NODES, PATH) of a group that takes none
                return f"{line!r}: no command {word!r} under {command.name!r}"
            command = sub
    return None


def test_every_guardctl_line_in_the_operator_docs_names_real_commands_and_options() -> None:
    problems = [
        f"{page.relative_to(ROOT)}: {why}"
        for page in PAGES
        for line in invocations(page.read_text())
        if (why := check(line))
    ]
    assert problems == []


def test_the_command_reference_is_the_command_line_s_own_help() -> None:
    """docs/reference/commands.md is written by tools/commands_reference.py; run it again when
    a command or an option changes."""
    spec = importlib.util.spec_from_file_location("commands_reference", TOOL)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert (ROOT / "docs" / "reference" / "commands.md").read_text() == tool.page()


def test_every_configuration_example_in_the_operator_docs_is_valid() -> None:
    """An administrator copies these blocks into /etc/guardctl/guardctl.toml."""
    blocks = [
        (page.name, block)
        for page in PAGES
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S)
    ]
    assert len(blocks) >= 3
    for name, block in blocks:
        build_settings([Layer(name, tomllib.loads(block))])
