"""Generate guardctl(1) and guardctl.toml(5) from the CLI and the settings themselves.

The pages are generated, committed under ``man/``, and a test fails when the
committed pages differ from what this module generates, so the manual cannot
drift from the code. Regenerate with ``python -m guardctl.manpage man/``.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from guardctl import __version__
from guardctl.config import Settings
from guardctl.errors import ExitCode

DATE = "2026"  # fixed, so regeneration is reproducible

EXIT_CODES = {
    ExitCode.OK: "Success; nothing to act on.",
    ExitCode.FINDINGS: "Ran fine and found something to act on: a suspect or unhealthy node, "
    "a failed sweep, bad lines in a store check. Meant for cron and scripts.",
    ExitCode.USAGE: "Bad command line: unknown option, invalid or unknown node name.",
    ExitCode.CONFIG: "A configuration file or value is invalid; the message names file and key.",
    ExitCode.SLURM: "A Slurm command ran and failed, or Slurm is not installed.",
    ExitCode.SLURM_UNAVAILABLE: "Slurm did not answer within slurm.timeout_s, "
    "or its controller is down.",
    ExitCode.REFUSED: "Refused by a safety rule (a node held by someone else, the cap on nodes "
    "held out, the rate limit); nothing was changed.",
    ExitCode.INPUT: "Input data (a telemetry file or directory) cannot be read or is invalid.",
    ExitCode.IO: "The store or an output file cannot be written.",
    ExitCode.INTERNAL: "An internal error (a bug); rerun with --debug and report it.",
}

EXAMPLES = [
    ("The fleet at a glance, and as JSON for scripts:", "guardctl status\nguardctl status --json"),
    (
        "Take a suspect out of production for sweeps, then put it back:",
        "guardctl quarantine node7 --reason 'straggler in job 4242'\nguardctl release node7",
    ),
    (
        "See what a drain would do, then do it:",
        "guardctl drain 'node[3-4]' --reason 'XID 79' --dry-run\n"
        "guardctl drain 'node[3-4]' --reason 'XID 79'",
    ),
    ("Who did what, and why:", "guardctl history node7"),
]


def esc(text: str) -> str:
    """Escape text for roff."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        ("\\&" + line) if line.startswith((".", "'")) else line for line in out.split("\n")
    )


def _commands(group: click.Group, prefix: str) -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in sorted(group.list_commands(ctx)):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        full = f"{prefix} {name}"
        yield full, cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, full)


def _usage(cmd: click.Command, full: str) -> str:
    pieces = [
        p.make_metavar(click.Context(cmd)) for p in cmd.params if isinstance(p, click.Argument)
    ]
    return " ".join([full, "[OPTIONS]", *pieces])


def _options(cmd: click.Command) -> list[str]:
    lines = []
    ctx = click.Context(cmd)
    for param in cmd.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        record = param.get_help_record(ctx)
        if record:
            lines += [".TP", f"\\fB{esc(record[0])}\\fR", esc(record[1])]
    return lines


def _help(cmd: click.Command) -> str:
    return inspect.cleandoc(cmd.help or cmd.short_help or "").replace("\b\n", "")


def guardctl_1(main: click.Group) -> str:
    """The guardctl(1) page."""
    out = [
        f'.TH GUARDCTL 1 "{DATE}" "guardctl {__version__}" "User Commands"',
        ".SH NAME",
        "guardctl \\- find, prove and handle grey (slow) GPU nodes in a Slurm cluster",
        ".SH SYNOPSIS",
        "\\fBguardctl\\fR [\\fB\\-\\-config\\fR \\fIFILE\\fR] "
        "[\\fB\\-\\-set\\fR \\fISECTION.KEY=VALUE\\fR] [\\fB\\-\\-debug\\fR] "
        "\\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        esc(
            "guardctl watches the nodes of a Slurm cluster while training jobs run, finds the "
            "nodes that fall behind their peers, proves it with burn-in sweeps, and drains or "
            "returns them. It never resumes, releases or rewrites a node that someone else "
            "drained, downed or reserved; every action is logged with its evidence in the "
            "store's action log. Node sets use Slurm's hostlist syntax, e.g. node[1-4,7]."
        ),
        ".SH GLOBAL OPTIONS",
        *_options(main),
        ".SH COMMANDS",
    ]
    for full, cmd in _commands(main, "guardctl"):
        out += [".SS " + esc(_usage(cmd, full)), esc(_help(cmd)), *_options(cmd)]
    out += [".SH EXIT STATUS"]
    for code, text in EXIT_CODES.items():
        out += [".TP", f"\\fB{int(code)}\\fR", esc(text)]
    out += [
        ".SH ENVIRONMENT",
        ".TP",
        "\\fBGUARDCTL_CONFIG\\fR",
        esc("A further configuration file, read after /etc/guardctl."),
        ".TP",
        "\\fBGUARDCTL_STORE\\fR",
        esc("Overrides store.root for every command and for the training-job probe."),
        ".SH FILES",
        ".TP",
        "\\fB/etc/guardctl/guardctl.toml\\fR, \\fB/etc/guardctl/conf.d/*.toml\\fR",
        esc("Configuration; see guardctl.toml(5)."),
        ".TP",
        "\\fI<store>\\fR\\fB/actions/actions.jsonl\\fR",
        esc("The append-only action log: who, when, why, evidence."),
    ]
    out += [".SH EXAMPLES"]
    for text, commands in EXAMPLES:
        out += [".PP", esc(text), ".PP", ".nf", ".RS", esc(commands), ".RE", ".fi"]
    out += [".SH SEE ALSO", "guardctl.toml(5), guardctl-schema(5), sinfo(1), scontrol(1)", ""]
    return "\n".join(out)


def _field_comments(cls: type) -> dict[str, str]:
    """Trailing ``# comments`` on each field line of a settings dataclass."""
    source = inspect.getsource(sys.modules[cls.__module__])
    comments: dict[str, str] = {}
    pending_name = ""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4:
            pending_name = tok.string
        elif tok.type == tokenize.COMMENT and pending_name:
            comments.setdefault(pending_name, tok.string.lstrip("# ").strip())
        elif tok.type == tokenize.NEWLINE:
            pending_name = ""
    return comments


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_text(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"table of {_type_text(typing.get_args(tp)[1])}"
    return {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path | str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_default_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return repr(value)


def guardctl_toml_5() -> str:
    """The guardctl.toml(5) page, from the section dataclasses."""
    out = [
        f'.TH GUARDCTL.TOML 5 "{DATE}" "guardctl {__version__}" "File Formats"',
        ".SH NAME",
        "guardctl.toml \\- configuration of guardctl",
        ".SH DESCRIPTION",
        esc("guardctl reads its settings from layers; later layers win key by key:"),
        *[item for n, text in enumerate(LAYERS, 1) for item in (".IP", f"{n}.", esc(text))],
        ".PP",
        esc(
            "Every key is optional; an unknown key, a value of the wrong type or a "
            "number that is not finite (nan, inf) is an error (exit 3) that names the "
            "file and the key. So is a control.racks or control.models hostlist that "
            "does not expand, and a control.lease_s shorter than 3 x control.interval_s "
            "(the lease must outlast a pass by far)."
        ),
    ]
    defaults = Settings()
    hints = typing.get_type_hints(Settings)
    for section in dataclasses.fields(Settings):
        if section.name == "sources":
            continue
        cls = hints[section.name]
        comments = _field_comments(cls)
        out += [f".SH [{section.name}]", esc(inspect.cleandoc(cls.__doc__ or ""))]
        value = getattr(defaults, section.name)
        for fld in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[fld.name]
            text = f"{_type_text(tp)}, default {_default_text(getattr(value, fld.name))}."
            if fld.name in comments:
                text += " " + comments[fld.name][0].upper() + comments[fld.name][1:]
            out += [".TP", f"\\fB{fld.name}\\fR", esc(text)]
    out += [".SH EXAMPLE", ".nf", esc(EXAMPLE_TOML), ".fi", ".SH SEE ALSO", "guardctl(1)", ""]
    return "\n".join(out)


LAYERS = [
    "/etc/guardctl/guardctl.toml",
    "/etc/guardctl/conf.d/*.toml, in name order",
    "the file named by the environment variable GUARDCTL_CONFIG",
    "each --config FILE on the command line, in order",
    "each --set SECTION.KEY=VALUE on the command line (VALUE in TOML syntax; a bare word is a "
    "string)",
    "the environment variable GUARDCTL_STORE, for store.root only (so a training job's probe "
    "can be pointed elsewhere)",
]

EXAMPLE_TOML = """\
[store]
root = "/shared/guardctl"

[safety]
max_out_fraction = 0.05
max_out_nodes = 8

[quarantine]
users = ["root", "hpcops"]
"""


def pages() -> dict[str, str]:
    """Every generated page by file name."""
    from guardctl.cli import main

    return {"guardctl.1": guardctl_1(main), "guardctl.toml.5": guardctl_toml_5()}


def write(directory: Path) -> list[Path]:
    written = []
    for name, text in pages().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "man")):
        print(path)
