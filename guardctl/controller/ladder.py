"""Each node's place on the controller's ladder, read back from the action log.

The controller keeps no state file of its own: what it did is in the action log (its own
``control ...`` records beside the node actions it took through the door), so a crash loses
nothing and any pass, on any host, reads the same ladder:

* quarantined by the controller (a ``quarantine`` done or reconciled with ``by: control``,
  not followed by a release or drain) and waiting for the node to be free;
* the sweeps it ran and their verdicts (``control sweep``: pass, fail, undetermined or
  aborted), so passes within ``[control] relapse_window_s`` count the relapses, and the
  undetermined sweeps since its quarantine are retried a bounded number of times;
* suspect onsets (``control pass`` records list what was flagged), for flap suppression;
* the last decision recorded for the node, so an unchanged decision is not logged again;
* a sweep the daemon started and has not judged yet (``control sweeping``, closed by its
  ``control sweep``; :mod:`guardctl.controller.sweeps`);
* rung a (``control rebalance``): the job's step time when the controller took it and what
  came of it (:mod:`guardctl.controller.rebalance`), until the node is released or drained;
* fresh starts (``control fresh start``): a node someone else took out for repair (a drain,
  DOWN, a reboot) after guardctl's sweeps passed it comes back with its relapse count at
  zero: the passes before the repair say nothing about the node after it. guardctl's own
  drain is such a start too: the node goes to repair (the fleet simulation found a node
  drained for a failed sweep, repaired, and drained again as a lemon at its next flag, on
  passes from before the repair).

* a quarantine the controller took for a fabric finding (``fabric`` in its evidence: the
  component, e.g. ``leaf:s1``), which keeps new jobs off the nodes behind that component while
  the finding lasts and is never followed by a sweep of them.

Fabric findings themselves are ``control fabric`` notes, one per component when it is found
(or its nodes change) and one when it clears (:mod:`guardctl.controller.fabric`).

Observe-only's paper ladder (``control rehearsal`` notes, :mod:`guardctl.controller.rehearsal`)
goes to ``NodeLadder.rehearsal`` alone: what the controller would have done never counts as
done, never quarantines a node on the real ladder and never starts its relapses over.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from guardctl.actionlog import Entry

BY = "control"  # the evidence key 'by' of node actions the controller took
FRESH_START = "control fresh start"
REBALANCE = "control rebalance"
SWEEPING = "control sweeping"
REHEARSAL = "control rehearsal"
FABRIC = "control fabric"


@dataclass
class NodeLadder:
    """What the action log says about one node's time on the ladder."""

    node: str
    quarantined_by_control: bool = False
    quarantined_at: float | None = None
    sweeps: list[tuple[float, str]] = field(default_factory=list)  # (ts, verdict)
    onsets: list[float] = field(default_factory=list)  # when it became flagged
    last_decision: dict[str, Any] = field(default_factory=dict)
    fresh_start: float = 0.0  # relapses count from here (someone else held the node)
    rebalance: dict[str, Any] = field(default_factory=dict)  # rung a's latest record
    sweeping: dict[str, Any] = field(default_factory=dict)  # a started sweep, not yet judged
    last_sweep_why: str = ""  # the newest verdict's evidence (what an undetermined one lacked)
    rehearsal: dict[str, Any] = field(default_factory=dict)  # observe-only's newest paper step
    fabric: str = ""  # the fabric component the controller's quarantine of it is for ("": none)

    def passes_since(self, since: float) -> int:
        since = max(since, self.fresh_start)
        return sum(1 for ts, verdict in self.sweeps if verdict == "pass" and ts >= since)

    def needs_fresh_start(self, owner: str, out_for_repair: bool) -> bool:
        """Whether a node someone else holds out for repair (drained, down, rebooting; not
        merely silent after the Slurm controller restarted) must start its relapses over."""
        return owner == "held by someone else" and out_for_repair and self.passes_since(0.0) > 0

    def undetermined(self) -> list[float]:
        """When its sweeps measured nothing, oldest first: those since the controller
        quarantined it and after its newest pass or fail (an aborted sweep neither counts nor
        starts the count over)."""
        since = self.quarantined_at if self.quarantined_at is not None else float("-inf")
        out: list[float] = []
        for ts, verdict in self.sweeps:
            if ts < since:
                continue
            if verdict in ("pass", "fail"):
                out = []
            elif verdict == "undetermined":
                out.append(ts)
        return out

    def last_pass(self) -> float | None:
        passes = [ts for ts, verdict in self.sweeps if verdict == "pass"]
        return max(passes) if passes else None

    def onsets_since(self, since: float) -> int:
        return sum(1 for ts in self.onsets if ts >= since)

    def episode_start(self) -> float | None:
        """When the node's current time as a suspect began (its latest onset)."""
        return self.onsets[-1] if self.onsets else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "quarantined_by_control": self.quarantined_by_control,
            "quarantined_at": self.quarantined_at,
            "sweeps": [{"ts": ts, "verdict": v} for ts, v in self.sweeps],
            "onsets": self.onsets,
            "last_decision": self.last_decision,
            "fresh_start": self.fresh_start,
            "rebalance": self.rebalance,
            "sweeping": self.sweeping,
            "last_sweep_why": self.last_sweep_why,
            "rehearsal": self.rehearsal,
            "fabric": self.fabric,
        }


def derive(entries: Iterable[Entry]) -> dict[str, NodeLadder]:
    """Every node's ladder from the action log, oldest entry first."""
    out: dict[str, NodeLadder] = {}
    flagged: set[str] = set()

    def of(node: str) -> NodeLadder:
        return out.setdefault(node, NodeLadder(node))

    for e in entries:
        if e.action == "control pass":
            now = set(e.nodes)
            for node in sorted(now - flagged):
                of(node).onsets.append(e.ts)
            flagged = now
        elif e.action == "control sweep":
            for node in e.nodes:
                of(node).sweeps.append((e.ts, str(e.evidence.get("verdict", ""))))
                of(node).last_sweep_why = e.reason
                if of(node).sweeping.get("sweep") == e.evidence.get("sweep"):
                    of(node).sweeping = {}
        elif e.action == SWEEPING:
            for node in e.nodes:
                of(node).sweeping = {**e.evidence, "ts": e.ts, "host": e.host, "pid": e.pid}
        elif e.action == "control decision":
            for node in e.nodes:
                of(node).last_decision = dict(e.evidence)
        elif e.action == FRESH_START:
            for node in e.nodes:
                of(node).fresh_start = e.ts
        elif e.action == REBALANCE:
            for node in e.nodes:
                of(node).rebalance = dict(e.evidence)
        elif e.action == REHEARSAL:
            for node in e.nodes:
                of(node).rehearsal = {**e.evidence, "ts": e.ts}
        elif e.phase in ("done", "reconciled") and e.action in ("quarantine", "release", "drain"):
            for node in e.nodes:
                ladder = of(node)
                mine = e.action == "quarantine" and e.evidence.get("by") == BY
                ladder.quarantined_by_control = mine
                ladder.quarantined_at = e.ts if mine else None
                ladder.fabric = str(e.evidence.get("fabric") or "") if mine else ""
                if e.action != "quarantine":  # swept and back, or out: rung a starts over
                    ladder.rebalance = {}
                if e.action == "drain":  # out for repair: relapses count from here
                    ladder.fresh_start = e.ts
    return out
