"""guardctl status: the fleet at a glance, Slurm's state beside guardctl's own."""

from __future__ import annotations

import time
from typing import Any

import click

from guardctl.actionlog import Entry
from guardctl.analyze.impact import describe
from guardctl.cli.base import AppContext, echo_json, echo_table, json_option, main, pass_app
from guardctl.controller.fabric import fabric_now, fabric_text
from guardctl.nodeops import NodeOps
from guardctl.nodes import expand_all, fold
from guardctl.slurm.types import JobInfo


def format_since(ts: float | None) -> str:
    """Local time of an event, or '-' when unknown."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


@main.command("status")
@click.argument("nodes", nargs=-1)
@json_option
@pass_app
def status(app: AppContext, nodes: tuple[str, ...], as_json: bool) -> None:
    """Show each node's Slurm state, guardctl's hold on it, the reason and since when.

    NODES are hostlist expressions (node[1-4,7]); default: every node. Reads only: intents
    left open (a crash, a Slurm timeout) are counted on stderr; the next acting command
    reconciles them. Below the nodes, the fabric findings open in the controller's log (a
    leaf switch, an uplink, a spine group or a node's link at fault): the component, the nodes
    behind it, the confidence and the evidence.
    """
    names = expand_all(nodes) if nodes else None
    ops = NodeOps(app.settings)
    rows = ops.status(names)  # reads only: reconciling changes Slurm, left to acting commands
    entries = ops.log.entries()
    costs = last_impacts(entries, ops.slurm.jobs())
    fabric = fabric_now(entries)
    left = ops.open_intents()
    if left:
        click.echo(
            f"guardctl: {left} intent(s) or leftover reservation(s) open; the next "
            "acting command reconciles them",
            err=True,
        )
    if as_json:
        echo_json(
            {
                "nodes": [{**r.as_dict(), "impact": costs.get(r.name)} for r in rows],
                "fabric": fabric,
            }
        )
        return
    echo_table(
        [
            (
                r.name,
                r.slurm_state,
                r.owner,
                r.reason or "-",
                format_since(r.since),
                describe(r.name, costs.get(r.name)) or "-",
            )
            for r in rows
        ],
        headers=("NODE", "SLURM STATE", "GUARDCTL", "REASON", "SINCE", "IMPACT"),
    )
    for f in fabric:
        click.echo(f"{fabric_text(f)}; since {format_since(f['since'])}")
        if f["quarantined"]:
            click.echo(f"  quarantined for it: {fold(f['quarantined'])}")


def last_impacts(entries: list[Entry], jobs: list[JobInfo]) -> dict[str, dict[str, Any]]:
    """What each node at fault costs its job, as the controller last saw it (its last pass),
    for the jobs that still run on that node: a job that ended, or left the node, costs no more.
    """
    last = next((e for e in reversed(entries) if e.action == "control pass"), None)
    if last is None:
        return {}
    running = {(str(j.job_id), n) for j in jobs if not j.finished for n in j.nodes}
    return {
        str(f["node"]): f["impact"]
        for f in last.evidence.get("findings", [])
        if isinstance(f, dict)
        and isinstance(f.get("impact"), dict)
        and (str(f["impact"].get("job")), str(f["node"])) in running
    }
