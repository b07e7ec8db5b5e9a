"""guardctl config: show the effective configuration and where each value came from.

The text form is TOML that ``tomllib`` reads back to the same settings (a file to start a
site's configuration from), each value followed by a comment naming its source: a file,
``--set``, ``$GUARDCTL_STORE``, or ``default``. It is written here rather than with a TOML
writer library because each line carries its own comment; the values are a closed set
(strings, numbers, booleans, lists and tables of them) and the tests read every line back.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from guardctl.cli.base import AppContext, echo_json, json_option, main, pass_app
from guardctl.config import as_dict, default_layers, origins

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_string(text: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters as \\uXXXX."""
    body = "".join(
        f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else "\\" + c if c in '"\\' else c
        for c in text
    )
    return f'"{body}"'


def toml_key(key: str) -> str:
    return key if BARE_KEY.match(key) else toml_string(key)


def toml_value(value: Any) -> str:
    """One value in TOML's inline syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = ", ".join(
            f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items() if v is not None
        )  # an unset field inside a table is left out
        return "{ " + items + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def comment(text: str) -> str:
    """*text* as a TOML comment: control characters (a newline in a path) would end it."""
    return "".join(c if c.isprintable() else "?" for c in text)


def toml_text(data: dict[str, Any], where: dict[str, str]) -> list[str]:
    lines = []
    for section, values in data.items():
        lines.append(f"[{toml_key(section)}]")
        for key, value in values.items():
            origin = comment(where.get(f"{section}.{key}", "default"))
            if value is None:  # TOML has no null: an unset value is left out, and said so
                lines.append(f"# {key} is not set  # {origin}")
            else:
                lines.append(f"{toml_key(key)} = {toml_value(value)}  # {origin}")
        lines.append("")
    return lines


@main.command("config")
@json_option
@pass_app
def config(app: AppContext, as_json: bool) -> None:
    """Validate the configuration layers and print the effective settings (TOML, each value's
    source in a comment)."""
    data = as_dict(app.settings)
    if as_json:
        echo_json(data)
        return
    sources = data.pop("sources") or ["(defaults only)"]
    where = origins(default_layers(app.config_files, app.assignments))
    click.echo("# read: " + comment(", ".join(sources)))
    click.echo("\n".join(toml_text(data, where)), nl=False)
