"""guardctl config: show the effective configuration and where it came from."""

from __future__ import annotations

import click

from guardctl.cli.base import AppContext, echo_json, json_option, main, pass_app
from guardctl.config import as_dict


@main.command("config")
@json_option
@pass_app
def config(app: AppContext, as_json: bool) -> None:
    """Validate the configuration layers and print the effective settings."""
    data = as_dict(app.settings)
    if as_json:
        echo_json(data)
        return
    sources = data.pop("sources") or ["(defaults only)"]
    click.echo("# read: " + ", ".join(sources))
    for section, values in data.items():
        click.echo(f"[{section}]")
        for key, value in values.items():
            click.echo(f"{key} = {value!r}")
        click.echo()
