"""What a report says, independent of its format: sections as titled tables.

Each finding goes with what guardctl did about it (:mod:`guardctl.report.actions`, from the
action log) and the step left to an operator; the summary opens with the fleet in ten
seconds: nodes slower than their peers, the GPU time they cost, what guardctl's quarantines kept
off the jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from guardctl.analyze import SUSPECT, UNKNOWN, WATCH
from guardctl.analyze.engine import bad_summary
from guardctl.analyze.impact import describe
from guardctl.analyze.timespec import iso
from guardctl.nodes import fold
from guardctl.report.actions import Actions
from guardctl.report.timeline import Timeline

OPERATOR_STEP = "sweep it (guardctl sweep), or leave it to the controller"


@dataclass(frozen=True)
class Section:
    title: str
    note: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


def summary(tl: Timeline, source: str, acts: Actions | None = None) -> list[tuple[str, str]]:
    latest = tl.latest
    now = latest.counts()
    acts = acts or Actions()
    return [
        ("Period", f"{iso(tl.start)} .. {iso(tl.end)} ({len(tl.times)} passes)"),
        *fleet_summary(tl, acts),
        ("Source", source),
        ("Nodes seen", str(len(tl.nodes))),
        ("Suspect now", str(now[SUSPECT])),
        ("Watch now (flagged, not persistent yet)", str(now[WATCH])),
        ("Unknown now (too little data to judge)", str(now[UNKNOWN])),
        ("Suspect at some point in the period", str(len(tl.ever_suspect()))),
        ("Input", f"{tl.records} records from {tl.files} files; bad lines: {bad_summary(tl.bad)}"),
        *([("Action log", f"not read: {acts.problem}")] if acts.problem else []),
    ]


def lost_gpu_h(tl: Timeline) -> float:
    """GPU-hours the nodes suspect now cost their jobs over the period (each node's measured
    cost a day, from when it was first suspect; an estimate: the newest window's cost)."""
    total = 0.0
    for n in tl.latest.suspects:
        rate = float((n.impact or {}).get("gpu_h_per_day") or 0.0)
        since = tl.first_suspect(n.node)
        total += rate * max(0.0, tl.end - (since if since is not None else tl.end)) / 86400
    return total


def fleet_summary(tl: Timeline, acts: Actions) -> list[tuple[str, str]]:
    """The fleet in ten seconds: how much ran slow, and what guardctl's actions bought."""
    suspects = tl.latest.suspects
    handled = [n.node for n in suspects if (s := acts.of(n.node)) and s.next_step()]
    out = [
        (
            "Slower than their peers now",
            f"{len(suspects)} node(s); guardctl handles {len(handled)}, "
            f"{len(suspects) - len(handled)} left to an operator",
        ),
        (
            "GPU time lost to slow nodes (est.)",
            f"{lost_gpu_h(tl):.1f} GPU-h in the period (the suspects' measured cost)",
        ),
        (
            "Kept off jobs by guardctl's quarantines (est.)",
            f"{acts.avoided_gpu_h(tl.end):.1f} GPU-h of slowdown since each quarantine",
        ),
    ]
    if acts.rehearsal:
        out.append(
            (
                "Would have kept off jobs (observe-only, est.)",
                f"{acts.would_avoid_gpu_h(tl.end):.1f} GPU-h over "
                f"{len({e.nodes[0] for e in acts.rehearsal if e.nodes})} node(s)",
            )
        )
    return out


def sections(tl: Timeline, acts: Actions | None = None) -> list[Section]:
    latest = tl.latest
    acts = acts or Actions()
    act = []
    for n in latest.suspects:
        story = acts.of(n.node)
        fabric = acts.fabric_of(n.node)
        step = (story.next_step() if story else "") or (
            f"none for the node: fabric {fabric.component} is at fault (see Fabric findings)"
            if fabric
            else OPERATOR_STEP
        )
        act.append(
            (
                n.node,
                f"{n.score:.2f}",
                n.job or "-",
                ",".join(map(str, n.gpus)) or "-",
                iso(tl.first_suspect(n.node) or tl.end),
                describe(n.node, n.impact) or "-",
                "; ".join(n.reasons[:3]),
                story.line() if story else ("no node action" if fabric else "nothing yet"),
                step,
            )
        )
    now = {n.node for n in latest.suspects}
    past = []
    for node in tl.ever_suspect():
        if node not in now:
            first = tl.first_suspect(node)
            story = acts.of(node)
            past.append(
                (
                    node,
                    iso(first) if first is not None else "-",
                    story.line() if story else "nothing",
                )
            )
    unknown = [
        (n.node, n.job or "-", n.reasons[0] if n.reasons else "-")
        for n in latest.nodes
        if n.verdict == UNKNOWN
    ]
    return [
        Section(
            "Act on these: suspect now",
            "Flagged in enough recent windows, with what guardctl did about each and the step "
            "left to an operator.",
            (
                "node",
                "score",
                "job",
                "GPUs",
                "suspect since",
                "impact",
                "reasons",
                "guardctl did",
                "operator's step",
            ),
            act,
        ),
        Section(
            "Suspect earlier in the period, not now",
            "Recovered, intermittent or taken out by guardctl: watch them.",
            ("node", "first suspect", "guardctl did"),
            past,
        ),
        *_fabric(acts),
        *_handled_elsewhere(acts, now | set(tl.ever_suspect())),
        *_rehearsal(acts),
        Section(
            "Unknown: too little telemetry to judge",
            "A gap in the newest window: check that the node agent is running; a run too "
            "short or a job too small to compare: nothing was judged.",
            ("node", "job", "why"),
            unknown,
        ),
    ]


def _fabric(acts: Actions) -> list[Section]:
    """The fabric components the controller found at fault in the period."""
    if not acts.fabric:
        return []
    rows = []
    for f in acts.fabric:
        ev = f.finding
        rows.append(
            (
                f.component,
                fold(f.nodes) if f.nodes else "-",
                f"{float(ev.get('confidence') or 0.0):.2f}",
                iso(f.found),
                iso(f.cleared) if f.cleared is not None else "open",
                "; ".join(ev.get("evidence_for") or ()) or "-",
                "; ".join(ev.get("evidence_against") or ()) or "-",
                str(ev.get("settle") or "-"),
                f"quarantine of its nodes: {f.quarantine}" if f.quarantine else "no node action",
            )
        )
    return [
        Section(
            "Fabric findings: the network, not the nodes",
            "A switch, an uplink, a spine group or a node's link the controller found at fault "
            "from its nodes' symptoms: the nodes behind a switch are not swept, drained or "
            "quarantined for it (but with control.fabric_quarantine); check the component.",
            (
                "component",
                "nodes",
                "confidence",
                "found",
                "cleared",
                "evidence for",
                "evidence against",
                "to settle it",
                "guardctl did",
            ),
            rows,
        )
    ]


def _handled_elsewhere(acts: Actions, shown: set[str]) -> list[Section]:
    """Nodes guardctl acted on that the period's telemetry did not hold suspect."""
    rows = [(node, s.line()) for node, s in sorted(acts.stories.items()) if node not in shown]
    if not rows:
        return []
    return [
        Section(
            "guardctl's other actions in the period",
            "Nodes guardctl acted on that this period's telemetry does not hold suspect.",
            ("node", "guardctl did"),
            rows,
        )
    ]


def _rehearsal(acts: Actions) -> list[Section]:
    """Observe-only's paper ladder: what the controller would have done, step by step."""
    if not acts.rehearsal:
        return []
    rows = [
        (iso(e.ts), ",".join(e.nodes), str(e.evidence.get("step", "")), e.reason)
        for e in acts.rehearsal
    ]
    return [
        Section(
            "What guardctl would have done (observe-only)",
            "The controller observed only: nothing was done to Slurm. Each line is a "
            "step it would have taken (guardctl history --control shows them).",
            ("when", "node", "step", "what"),
            rows,
        )
    ]
