"""guardctl status: the fleet at a glance, Slurm's state beside guardctl's own."""

from __future__ import annotations

import time
from typing import Any

import click

from guardctl.actionlog import Entry
from guardctl.cli.base import AppContext, echo_json, echo_table, json_option, main, pass_app
from guardctl.controller.impact import describe
from guardctl.nodeops import NodeOps
from guardctl.nodes import expand_all


def format_since(ts: float | None) -> str:
    """Local time of an event, or '-' when unknown."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


@main.command("status")
@click.argument("nodes", nargs=-1)
@json_option
@pass_app
def status(app: AppContext, nodes: tuple[str, ...], as_json: bool) -> None:
    """Show each node's Slurm state, guardctl's hold on it, the reason and since when.

    NODES are hostlist expressions (node[1-4,7]); default: every node.
    """
    names = expand_all(nodes) if nodes else None
    ops = NodeOps(app.settings)
    rows = ops.status(names)
    costs = last_impacts(ops.log.entries())
    if as_json:
        echo_json({"nodes": [{**r.as_dict(), "impact": costs.get(r.name)} for r in rows]})
        return
    echo_table(
        [(r.name, r.slurm_state, r.owner, r.reason or "-", format_since(r.since),
          describe(r.name, costs.get(r.name)) or "-") for r in rows],
        headers=("NODE", "SLURM STATE", "GUARDCTL", "REASON", "SINCE", "IMPACT"),
    )


def last_impacts(entries: list[Entry]) -> dict[str, dict[str, Any]]:
    """What each node at fault cost its job when the controller last looked (its last pass)."""
    last = next((e for e in reversed(entries) if e.action == "control pass"), None)
    if last is None:
        return {}
    return {str(f["node"]): f["impact"] for f in last.evidence.get("findings", [])
            if isinstance(f, dict) and f.get("impact")}
