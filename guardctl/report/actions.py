"""What guardctl did about each node, from the action log, for the report beside its findings.

A report built from telemetry alone would tell an operator to drain and sweep a node the
controller swept and released a quarter of an hour ago. So each finding is shown with the
node's story in the log since the period began (quarantined, swept and the verdict, released
or drained, a sweep that measured nothing, a job requeued off it), the step left to the
operator (none when guardctl handles it), and the fleet summary with what those actions kept
off the jobs. Observe-only's paper ladder (``control rehearsal`` notes) is the week of what the
controller would have done. Fabric findings (``control fabric`` records: a leaf switch, an
uplink, a spine group or a node's link at fault) are shown per component, from when the
controller found each to when it cleared, with the evidence and what would settle it; the
nodes behind one are not the operator's to sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl.actionlog import ActionLog, Entry
from guardctl.analyze.timespec import iso
from guardctl.controller.ladder import FABRIC, REHEARSAL, SWEEPING
from guardctl.nodeops.ownership import REQUEUE

DONE = ("done", "reconciled")


@dataclass
class Story:
    """One node's time in guardctl's hands over the period, oldest step first."""

    node: str
    steps: list[str] = field(default_factory=list)
    state: str = ""  # quarantined, sweeping, released, drained (the newest node action)
    since: float = 0.0  # when it entered that state
    quarantined: list[tuple[float, float | None, dict[str, Any]]] = field(default_factory=list)
    fabric: str = ""  # the fabric component its newest quarantine by guardctl was for

    def line(self) -> str:
        return "; ".join(self.steps)

    def next_step(self) -> str:
        """What the report asks of an operator for this node, given what guardctl did."""
        if self.state == "released":
            return (
                f"none: swept and released at {iso(self.since)}; flagged again on newer "
                "data, the controller sweeps it again"
            )
        if self.state == "drained":
            return f"repair it: drained by guardctl at {iso(self.since)}"
        if self.state == "sweeping":
            return "none: guardctl's sweep of it runs"
        if self.state == "quarantined" and self.fabric:
            return (
                f"none: quarantined by guardctl at {iso(self.since)} while fabric "
                f"{self.fabric} is at fault; released when it clears"
            )
        if self.state == "quarantined":
            return (
                f"none: quarantined by guardctl at {iso(self.since)}; the controller "
                "sweeps it when free"
            )
        return ""


@dataclass
class FabricStory:
    """One fabric component's time at fault in the period: its newest finding, when it was
    found, and when it cleared (None: open at the end)."""

    component: str
    found: float
    finding: dict[str, Any]
    nodes: tuple[str, ...]
    cleared: float | None = None
    quarantine: str = ""  # what came of keeping new jobs off its nodes ("" : not tried)


@dataclass
class Actions:
    """The action log's side of a report."""

    stories: dict[str, Story] = field(default_factory=dict)
    rehearsal: list[Entry] = field(default_factory=list)
    problem: str = ""  # why the log could not be read ("" when it was, or there is none)
    fabric: list[FabricStory] = field(default_factory=list)

    def of(self, node: str) -> Story | None:
        return self.stories.get(node)

    def fabric_of(self, node: str) -> FabricStory | None:
        """The open fabric finding whose component carries *node*'s traffic, if any."""
        return next(
            (
                f
                for f in reversed(self.fabric)
                if f.cleared is None
                and node in f.nodes
                and f.finding.get("kind") != "link"  # a link is the node's own fault
            ),
            None,
        )

    def avoided_gpu_h(self, until: float) -> float:
        """Slowdown kept off jobs by guardctl's quarantines (GPU-hours): each quarantined
        node's measured cost a day, from its quarantine to its release or *until*."""
        return sum(
            _rate(ev) * max(0.0, min(end or until, until) - start) / 86400
            for s in self.stories.values()
            for start, end, ev in s.quarantined
        )

    def would_avoid_gpu_h(self, until: float) -> float:
        """The same for observe-only's paper quarantines, to the paper sweep or *until*."""
        total, opened = 0.0, {}
        for e in self.rehearsal:
            node, step = e.nodes[0] if e.nodes else "", e.evidence.get("step")
            if step == "quarantine":
                opened[node] = e
            elif step in ("sweep", "end") and node in opened:
                start = opened.pop(node)
                total += _rate(start.evidence) * max(0.0, min(e.ts, until) - start.ts) / 86400
        total += sum(_rate(e.evidence) * max(0.0, until - e.ts) / 86400 for e in opened.values())
        return total


def _rate(evidence: dict[str, Any]) -> float:
    impact = evidence.get("impact") or {}
    try:
        return float(impact.get("gpu_h_per_day") or 0.0)
    except (TypeError, ValueError, AttributeError):
        return 0.0


def read_actions(root: Path, since: float) -> Actions:
    """The log's stories from *since* on; a log that cannot be read is said, not raised (the
    report still says what the telemetry shows)."""
    from guardctl.errors import StoreError

    try:
        entries = ActionLog(root).entries()
    except StoreError as exc:
        return Actions(problem=str(exc))
    return stories(entries, since)


def stories(entries: Sequence[Entry], since: float) -> Actions:
    out = Actions()
    opened: dict[str, FabricStory] = {}
    for e in entries:
        if e.action == FABRIC:  # one found before the period and open in it counts too
            _fabric(out, opened, e, since)
            continue
        if e.ts < since:
            continue
        if e.action == REHEARSAL:
            out.rehearsal.append(e)
            continue
        for node in e.nodes:
            _step(out.stories, node, e)
    out.stories = {n: s for n, s in out.stories.items() if s.steps}
    return out


def _fabric(out: Actions, opened: dict[str, FabricStory], e: Entry, since: float) -> None:
    """A ``control fabric`` record: a component found (again), cleared, or its quarantine."""
    name, phase = str(e.evidence.get("component", "")), e.evidence.get("phase")
    story = opened.get(name)
    if phase == "open":
        if story is None:
            story = opened[name] = FabricStory(name, e.ts, dict(e.evidence), tuple(e.nodes))
            out.fabric.append(story)
        story.finding, story.nodes = dict(e.evidence), tuple(e.nodes)
    elif story is not None and phase == "cleared":
        story.cleared = e.ts
        del opened[name]
    elif story is not None and phase == "quarantine":
        story.quarantine = str(e.evidence.get("outcome", ""))
    out.fabric = [f for f in out.fabric if f.cleared is None or f.cleared >= since]


def _step(stories: dict[str, Story], node: str, e: Entry) -> None:
    story = stories.setdefault(node, Story(node))
    ev = e.evidence
    if e.phase in DONE and e.action == "quarantine":
        fabric = str(ev.get("fabric") or "")
        story.steps.append(
            f"quarantined at {iso(e.ts)}"
            + (f" while fabric {fabric} is at fault" if fabric else "")
        )
        story.state, story.since, story.fabric = "quarantined", e.ts, fabric
        story.quarantined.append((e.ts, None, ev))
    elif e.phase in DONE and e.action in ("release", "drain", "resume"):
        word = {"release": "released", "drain": "drained", "resume": "resumed"}[e.action]
        story.steps.append(f"{word} at {iso(e.ts)}")
        story.state, story.since = word, e.ts
        story.quarantined = [
            (s, end if end is not None else e.ts, q) for s, end, q in story.quarantined
        ]
    elif e.action == SWEEPING:
        story.steps.append(f"sweep {ev.get('sweep', '')} started at {iso(e.ts)}")
        story.state, story.since = "sweeping", e.ts
    elif e.action == "control sweep":
        _verdict(story, e)
    elif e.action == REQUEUE and e.phase == "done":
        story.steps.append(f"requeued job {ev.get('job')} off it at {iso(e.ts)}")


def _verdict(story: Story, e: Entry) -> None:
    """A judged sweep, merged with the release or drain its verdict made just before."""
    verdict = str(e.evidence.get("verdict", ""))
    acted = story.steps[-1] if story.steps else ""
    if verdict in ("pass", "fail") and acted.startswith(("released at", "drained at")):
        story.steps[-1] = f"swept: {verdict}, {acted}"
        return
    if story.state == "sweeping":
        story.state = "quarantined"
    if verdict == "undetermined":
        story.steps.append(f"swept: undetermined at {iso(e.ts)} ({e.reason}); kept quarantined")
    elif verdict == "aborted":
        story.steps.append(f"sweep aborted at {iso(e.ts)}; kept quarantined")
    else:
        story.steps.append(f"swept: {verdict}, {e.evidence.get('action', '')} at {iso(e.ts)}")
