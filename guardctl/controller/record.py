"""The controller's records in the action log: each decision once, with its evidence.

Everything goes through :meth:`guardctl.nodeops.NodeOps.record` as ``control ...`` notes:

* ``control pass``: the nodes found at fault, written when that set changes (the ladder reads
  suspect onsets, for flap suppression and the ski-rental rule, from these);
* ``control fleet``: a fleet-wide finding (a job, a rack or the fleet), written when new;
* ``control fabric``: a fabric finding (``leaf:s1``, ``uplink:s1``, ``spine:s0``,
  ``link:node3``): phase ``open`` with the component, its kind, the nodes behind it, the
  evidence for and against, the confidence and the test that would settle it, written when the
  component is found or its nodes change; phase ``cleared`` once when no pass finds it any
  more; phase ``quarantine`` with the outcome of keeping new jobs off its nodes
  (``[control] fabric_quarantine``), written when that outcome changes;
* ``control decision``: a node's decision, its rung, why and its evidence, written when it
  differs from the node's last one (an unchanged wait is not logged every pass);
* ``control sweep``: a sweep's verdict (``control requeue``, a job requeued off a node, is an
  action with an intent and an outcome: :meth:`guardctl.nodeops.NodeOps.requeue`);
* ``control rebalance``: rung a's watch of a job's step time when taken, and again when it
  recovered or did not (:mod:`guardctl.controller.rebalance`);
* ``control fresh start``: a node with passed sweeps that someone else now holds; its
  relapse count starts over (:mod:`guardctl.controller.ladder`).

Beside the log, each controller host keeps its last pass in ``<store>/control/passes/<host>.json``
(:func:`write_pass`: when it ended, how long it took, whether it led, acted or was held back,
and the error of a pass that failed), rewritten each pass, so that ``guardctl export`` can say
whether the controller is alive (:func:`read_passes`): the log says only what it decided.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from guardctl.actionlog import Entry
from guardctl.controller.classify import Classified
from guardctl.controller.fabric import open_fabric
from guardctl.controller.ladder import FABRIC, FRESH_START, REBALANCE, NodeLadder
from guardctl.controller.policy import Decision, fabric_findings
from guardctl.errors import StoreError
from guardctl.fileio import atomic_write
from guardctl.nodeops import NodeOps
from guardctl.storage import layout


def _last(entries: Sequence[Entry], action: str) -> Entry | None:
    return next((e for e in reversed(entries) if e.action == action), None)


def faults(classified: Classified) -> list[str]:
    return sorted(f.node for f in classified.findings if f.kind == "persistent")


def record_pass(ops: NodeOps, entries: Sequence[Entry], classified: Classified) -> None:
    """Note the set of nodes at fault when it changed since the last pass."""
    now = faults(classified)
    last = _last(entries, "control pass")
    if last is not None and sorted(last.nodes) == now:
        return
    if last is None and not now:
        return
    ops.record(
        "control pass",
        now,
        reason=f"{len(now)} node(s) at fault",
        evidence={"findings": [f.as_dict() for f in classified.findings if f.node in now]},
    )


def record_fleet(ops: NodeOps, entries: Sequence[Entry], classified: Classified) -> None:
    """Note each fleet-wide finding once (again only when its nodes change)."""
    for finding in classified.fleet:
        same = [
            e
            for e in entries
            if e.action == "control fleet"
            and e.evidence.get("scope") == finding.scope
            and e.evidence.get("name") == finding.name
        ]
        if same and sorted(same[-1].nodes) == sorted(finding.nodes):
            continue
        ops.record(
            "control fleet", list(finding.nodes), reason=finding.why, evidence=finding.as_dict()
        )


# A component a sweep named (its pairwise all-reduce slow through it) stays open this long
# though the analysis does not name it: telemetry may not show what only a sweep's load does.
SWEEP_FINDING_HOLD_S = 3600.0


def record_fabric(ops: NodeOps, entries: Sequence[Entry], classified: Classified) -> list[str]:
    """Note each fabric finding when found (again only when its nodes change) and each one
    that was open and is found no more (one a sweep named: an hour after it); the components
    cleared."""
    opened = open_fabric(entries)
    now = ops.clock()
    found = {f.component: f for f in fabric_findings(classified)}
    for name, finding in found.items():
        last = opened.get(name)
        if last is not None and sorted(last.nodes) == sorted(finding.nodes):
            continue
        ops.record(
            FABRIC,
            list(finding.nodes),
            reason=f"{finding.component} at fault: {'; '.join(finding.evidence_for) or '-'}",
            evidence={**finding.as_dict(), "phase": "open"},
        )
    cleared = [
        name
        for name, last in opened.items()
        if name not in found
        and not (last.evidence.get("source") == "sweep" and now - last.ts < SWEEP_FINDING_HOLD_S)
    ]
    for name in cleared:
        last = opened[name]
        ops.record(
            FABRIC,
            list(last.nodes),
            reason=f"{name}: no longer found at fault",
            evidence={
                "component": name,
                "kind": last.evidence.get("kind"),
                "phase": "cleared",
                "since": last.ts,
            },
        )
    return cleared


def record_fabric_quarantine(
    ops: NodeOps, entries: Sequence[Entry], component: str, nodes: Sequence[str], outcome: str
) -> None:
    """Note what came of quarantining a fabric finding's nodes, when it differs from the last
    such note of that component (a cap that refuses it every pass is said once)."""
    last = next(
        (
            e
            for e in reversed(entries)
            if e.action == FABRIC and e.evidence.get("component") == component
        ),
        None,
    )
    if (
        last is not None
        and last.evidence.get("phase") == "quarantine"
        and last.evidence.get("outcome") == outcome
    ):
        return
    ops.record(
        FABRIC,
        list(nodes),
        reason=f"{component}: quarantine its nodes: {outcome}",
        evidence={"component": component, "phase": "quarantine", "outcome": outcome},
    )


def changed(decision: Decision, ladder: NodeLadder | None, outcome: str) -> bool:
    """Whether the decision (or what came of it) differs from the node's last record."""
    last = ladder.last_decision if ladder else {}
    return (last.get("decision"), last.get("why"), last.get("outcome")) != (
        decision.action,
        decision.why,
        outcome,
    )


def record_decision(
    ops: NodeOps, decision: Decision, outcome: str, extra: dict[str, Any] | None = None
) -> Entry:
    return ops.record(
        "control decision",
        [decision.node],
        reason=decision.why,
        evidence={**decision.as_dict(), "outcome": outcome, **(extra or {})},
    )


def record_rebalance(ops: NodeOps, decision: Decision, ladder: NodeLadder | None) -> None:
    """Note rung a's watch when it is taken and when it recovers or does not."""
    watch = decision.evidence.get("rebalance")
    if not isinstance(watch, dict) or "phase" not in watch:
        return  # no watch: nothing to check the step time on
    last = ladder.rebalance if ladder else {}
    key = ("phase", "job", "since")
    if tuple(last.get(k) for k in key) == tuple(watch.get(k) for k in key):
        return
    ops.record(REBALANCE, [decision.node], reason=str(watch.get("why", "")), evidence=watch)


def record_fresh_starts(
    ops: NodeOps,
    ladders: Mapping[str, NodeLadder],
    owners: Mapping[str, tuple[str, str]],
    out_for_repair: Callable[[str], bool],
) -> list[str]:
    """Note a fresh start for each node with passed sweeps that someone else holds out for
    repair now."""
    out = []
    for node, ladder in sorted(ladders.items()):
        owner, why = owners.get(node, ("in service", ""))
        if ladder.needs_fresh_start(owner, node in owners and out_for_repair(node)):
            ops.record(
                FRESH_START,
                [node],
                reason=f"held by someone else ({why}): its relapse count starts over",
                evidence={"owner": why},
            )
            out.append(node)
    return out


def write_pass(root: Path, host: str, status: Mapping[str, Any]) -> str:
    """Rewrite this host's last-pass file (atomically); "" or why it could not (never raised:
    a store that cannot be written is what the export's ``guardctl_store_writable`` says)."""
    try:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", host).lstrip(".") or "host"
        path = layout.control_passes_dir(root) / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"host": host, **status}, sort_keys=True) + "\n")
    except (OSError, StoreError) as exc:
        return f"cannot write the controller's pass status: {exc}"
    return ""


def read_passes(root: Path) -> list[dict[str, Any]]:
    """Every controller host's last pass, as written by :func:`write_pass` (unreadable or torn
    files left out: the next pass rewrites them)."""
    out = []
    try:
        files = sorted(layout.control_passes_dir(root).glob("*.json"))
    except OSError:
        return []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("ts"), (int, float)):
            out.append(data)
    return out
