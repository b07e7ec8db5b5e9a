"""guardctl drain / resume / quarantine / release: node actions under the safety rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import click

from guardctl.cli.base import (
    AppContext,
    dry_run_option,
    echo_json,
    echo_table,
    json_option,
    main,
    pass_app,
)
from guardctl.nodeops import Action, NodeOps
from guardctl.nodes import expand_all
from guardctl.storage import store


def _show(actions: Sequence[Action], as_json: bool, dry_run: bool) -> None:
    if as_json:
        echo_json({"dry_run": dry_run, "actions": [a.as_dict() for a in actions]})
        return
    echo_table(
        [(a.node, a.action, a.outcome, a.message) for a in actions],
        headers=("NODE", "ACTION", "OUTCOME", "DETAIL"),
    )


def _act(
    app: AppContext,
    nodes: tuple[str, ...],
    as_json: bool,
    dry_run: bool,
    call: Callable[[NodeOps, list[str], bool], list[Action]],
) -> None:
    names = expand_all(nodes)
    store.require_marked(app.settings.store.root)  # the action log and the cap count live there
    ops = NodeOps(app.settings)
    dry = dry_run or app.settings.safety.observe_only
    _show(call(ops, names, dry), as_json, dry)


@main.command("drain")
@click.argument("nodes", nargs=-1, required=True)
@click.option("--reason", required=True, help="Why; stored as 'guardctl: REASON' in Slurm.")
@dry_run_option
@json_option
@pass_app
def drain(
    app: AppContext, nodes: tuple[str, ...], reason: str, dry_run: bool, as_json: bool
) -> None:
    """Drain NODES with a guardctl: reason (refuses nodes held by someone else)."""
    _act(app, nodes, as_json, dry_run, lambda c, n, d: c.drain(n, reason, dry_run=d))


@main.command("resume")
@click.argument("nodes", nargs=-1, required=True)
@dry_run_option
@json_option
@pass_app
def resume(app: AppContext, nodes: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Resume NODES that guardctl drained; a node drained by anyone else is left alone."""
    _act(app, nodes, as_json, dry_run, lambda c, n, d: c.resume(n, dry_run=d))


@main.command("quarantine")
@click.argument("nodes", nargs=-1, required=True)
@click.option("--reason", default="suspect", show_default=True, help="Why, for the action log.")
@dry_run_option
@json_option
@pass_app
def quarantine(
    app: AppContext, nodes: tuple[str, ...], reason: str, dry_run: bool, as_json: bool
) -> None:
    """Take NODES out of production into a maintenance reservation, open to sweep jobs."""
    _act(app, nodes, as_json, dry_run, lambda c, n, d: c.quarantine(n, reason, dry_run=d))


@main.command("release")
@click.argument("nodes", nargs=-1, required=True)
@dry_run_option
@json_option
@pass_app
def release(app: AppContext, nodes: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Put quarantined NODES back into production (only guardctl's own reservations)."""
    _act(app, nodes, as_json, dry_run, lambda c, n, d: c.release(n, dry_run=d))
