"""guardctl history: the action log, newest last."""

from __future__ import annotations

from typing import Any

import click

from guardctl.actionlog import ActionLog, Entry
from guardctl.cli.base import AppContext, echo_json, echo_table, json_option, main, pass_app
from guardctl.cli.status import format_since
from guardctl.nodeops.ownership import NODE_ACTIONS
from guardctl.nodes import expand_all


@main.command("history")
@click.argument("nodes", nargs=-1)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--control",
    "control_only",
    is_flag=True,
    help="Only the controller's decisions, findings (fabric findings among them) and sweeps, "
    "with their evidence.",
)
@json_option
@pass_app
def history(
    app: AppContext, nodes: tuple[str, ...], limit: int, control_only: bool, as_json: bool
) -> None:
    """Show what guardctl did (and to NODES, if given): who, when, why, with what evidence."""
    names = expand_all(nodes) if nodes else None
    entries = ActionLog(app.settings.store.root).history(names, 100_000 if control_only else limit)
    if control_only:
        entries = controller_entries(entries)[-limit:]
    if as_json:
        echo_json({"entries": [e.as_dict() for e in entries]})
        return
    echo_table(
        [
            (
                format_since(e.ts),
                e.action,
                e.phase,
                ",".join(e.nodes),
                e.actor,
                e.reason or "-",
                evidence_line(e.evidence),
            )
            for e in entries
        ],
        headers=("WHEN", "ACTION", "PHASE", "NODES", "WHO", "REASON", "EVIDENCE"),
    )


def controller_entries(entries: list[Entry]) -> list[Entry]:
    """The controller's records and actions, with the node actions its sweeps took (a release
    or drain on a sweep's verdict is logged by the sweep, under the controller's sweep id)."""
    swept = {
        str(e.evidence["sweep"])
        for e in entries
        if e.action.startswith("control") and e.evidence.get("sweep")
    }
    return [
        e
        for e in entries
        if e.action.startswith("control")
        or e.evidence.get("by") == "control"
        or (e.action in NODE_ACTIONS and str(e.evidence.get("sweep", "")) in swept)
    ]


def evidence_line(evidence: dict[str, Any]) -> str:
    """The evidence an operator reads first: a fabric component, a decision, its outcome, a
    verdict, a cost."""
    parts = []
    for key in (
        "component",
        "fabric",
        "decision",
        "rung",
        "outcome",
        "verdict",
        "action",
        "kind",
        "sweep",
        "job",
        "phase",
    ):
        if evidence.get(key) not in (None, "", []):
            parts.append(f"{key}={evidence[key]}")
    if isinstance(evidence.get("confidence"), (int, float)):
        parts.append(f"confidence={float(evidence['confidence']):.2f}")
    impact = evidence.get("impact")
    if isinstance(impact, dict) and "pct" in impact:
        parts.append(f"impact={impact['pct']}% {impact.get('gpu_h_per_day')} GPU-h/day")
    return " ".join(parts) or "-"
