"""Observe-only on paper: the whole ladder walked without a change to Slurm.

An operator runs the controller observe-only for a week before trusting it, and wants to see
what it would have done, not a quarantine previewed again at every pass. So an observing
controller (``[safety] observe_only`` or ``guardctl control`` without ``--act``) keeps a
ladder on paper, in the action log as ``control rehearsal`` notes (never an intent, never a
node action, never a Slurm call):

* ``quarantine``: the controller would have quarantined the node; from then on the policy sees
  it, on paper, as quarantined by the controller (:func:`paper_view`), so its next decisions
  are those of a quarantined node: wait for its jobs, requeue one (the ski-rental rule), and
* ``sweep``: once it is free, it would be swept. A sweep cannot run without a reservation and
  jobs, so the paper ladder stops there: "would sweep when free; the verdict decides drain or
  release". A flag on data newer than the paper sweep starts a new paper episode (a relapse,
  had the sweep passed);
* ``requeue``: a job the rule would have requeued off the node (it runs on, on paper);
* ``end``: a swept node no longer flagged, or a node someone else now holds: its paper
  episode is over.

The notes are kept apart from the controller's real ladder (:func:`guardctl.controller.ladder.
derive` reads them into ``NodeLadder.rehearsal`` only): they never count toward
``control.max_actions_per_hour``, never make a node guardctl's, and an acting controller
ignores them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from guardctl.controller.ladder import REHEARSAL, NodeLadder
from guardctl.controller.policy import Decision, View
from guardctl.nodeops import NodeOps

SWEEP_LINE = "would sweep when free; the verdict decides drain or release"


def paper_quarantined(ladder: NodeLadder | None) -> bool:
    """Whether the node is, on paper, in a quarantine it has not been swept out of yet."""
    return bool(ladder and ladder.rehearsal.get("step") in ("quarantine", "requeue"))


def paper_view(view: View) -> View:
    """*view* with every node quarantined on paper shown as the controller's quarantine (only
    where Slurm shows it in service: a node someone holds stays theirs)."""
    owners = dict(view.owners)
    ladders = dict(view.ladders)
    for node, ladder in view.ladders.items():
        if (
            not paper_quarantined(ladder)
            or owners.get(node, ("in service", ""))[0] != ("in service")
            or ladder.quarantined_by_control
        ):
            continue
        owners[node] = ("quarantined", "on paper (observe-only)")
        ladders[node] = dataclasses.replace(
            ladder, quarantined_by_control=True, quarantined_at=float(ladder.rehearsal["ts"])
        )
    return dataclasses.replace(view, owners=owners, ladders=ladders)


def rehearse(ops: NodeOps, view: View, decision: Decision, ladder: NodeLadder | None) -> str:
    """Note on paper what *decision* would have done (a note when its step is new); the
    decision's outcome: "would do" for an action, as ever (the note says what)."""
    paper = ladder.rehearsal if ladder else {}
    step, why = _step(view, decision, paper)
    if not step:
        return f"would do: {why}" if why else ("would do" if decision.acts else "")
    if (step, decision.job) != (paper.get("step"), paper.get("job")):
        evidence: dict[str, Any] = {
            "step": step,
            "decision": decision.action,
            "rung": decision.rung,
            "why": decision.why,
        }
        if decision.job is not None:
            evidence["job"] = decision.job
        impact = decision.evidence.get("impact")
        if impact:
            evidence["impact"] = impact
        ops.record(REHEARSAL, [decision.node], reason=why, evidence=evidence)
    return "would do" if decision.acts else ""


def _step(view: View, decision: Decision, paper: dict[str, Any]) -> tuple[str, str]:
    """The paper step *decision* takes ("" for none) and its line."""
    node, action = decision.node, decision.action
    last = paper.get("step")
    if action == "quarantine":
        finding = view.classified.of(node)
        if last == "sweep" and finding is not None and finding.newest <= float(paper["ts"]):
            # flagged on data from before its paper sweep: nothing new on paper
            return "", f"swept on paper; {SWEEP_LINE}"
        return "quarantine", f"would quarantine {node}: {decision.why}"
    if action == "sweep":
        return "sweep", f"{node}: {SWEEP_LINE}"
    if action == "requeue":
        return "requeue", f"would requeue job {decision.job} off {node}: {decision.why}"
    if action == "drain":
        return "drain", f"would drain {node}: {decision.why}"
    if last in ("sweep", "drain") and view.classified.of(node) is None:
        return "end", f"{node} no longer flagged: its paper episode ends"
    if last and action == "leave":
        return "end", f"{node}: {decision.why}; its paper episode ends"
    return "", ""
