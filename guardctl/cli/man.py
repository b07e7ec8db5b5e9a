"""guardctl man: show a manual page that pip installed into the venv, where man(1) cannot find it.

A venv's ``share/man`` is not on man's search path; this finds the page (installed, or in the
source checkout) and formats it with ``man -l``, or prints its path with ``--path``.
"""

from __future__ import annotations

import os
import shutil

import click

from guardctl import datafiles, runner
from guardctl.cli.base import main
from guardctl.errors import InputError

PAGES = {
    "guardctl": ("man1", "guardctl.1"),
    "guardctl.toml": ("man5", "guardctl.toml.5"),
    "guardctl-schema": ("man5", "guardctl-schema.5"),
}


@main.command("man")
@click.argument("page", type=click.Choice(sorted(PAGES)), default="guardctl", metavar="[PAGE]")
@click.option("--path", "path_only", is_flag=True, help="Print the page's file path only.")
def man(page: str, path_only: bool) -> None:
    """Show a manual page: guardctl(1), guardctl.toml(5) or guardctl-schema(5)."""
    kind, name = PAGES[page]
    found = datafiles.find(kind, name)
    if found is None:
        where = ", ".join(str(p) for p in datafiles.candidates(kind))
        raise InputError(f"{name}: not installed (looked in {where})")
    if path_only:
        click.echo(str(found))
        return
    if shutil.which("man") is None:  # no man(1) on this host: the page's source is still useful
        click.echo(found.read_text())
        return
    env = {**os.environ, "MANWIDTH": os.environ.get("MANWIDTH", "100")}
    text = runner.run(["man", "-l", "-P", "cat", str(found)], timeout=30, env=env).stdout
    click.echo_via_pager(text)
