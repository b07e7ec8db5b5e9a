"""guardctl history: the action log, newest last."""

from __future__ import annotations

import click

from guardctl.actionlog import ActionLog
from guardctl.cli.base import AppContext, echo_json, echo_table, json_option, main, pass_app
from guardctl.cli.status import format_since
from guardctl.nodes import expand_all


@main.command("history")
@click.argument("nodes", nargs=-1)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@json_option
@pass_app
def history(app: AppContext, nodes: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Show what guardctl did (and to NODES, if given): who, when, why, with what evidence."""
    names = expand_all(nodes) if nodes else None
    entries = ActionLog(app.settings.store.root).history(names, limit)
    if as_json:
        echo_json({"entries": [e.as_dict() for e in entries]})
        return
    echo_table(
        [
            (format_since(e.ts), e.action, e.phase, ",".join(e.nodes), e.actor, e.reason or "-")
            for e in entries
        ],
        headers=("WHEN", "ACTION", "PHASE", "NODES", "WHO", "REASON"),
    )
