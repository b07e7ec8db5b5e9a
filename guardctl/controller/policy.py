"""The controller's decisions: a pure function of (findings, Slurm's view, the ladder).

Nothing here reads Slurm, the store or the clock: :func:`decide` is handed values, so the
tests (and a fleet simulation over the in-memory Slurm) can drive it directly. The ladder, for
a node the analysis finds at fault:

a. its job runs on it with the data-sharding service: the slow rank already gets less work;
   the job's step time is watched (:mod:`guardctl.controller.rebalance`): recovered, it stays
   here; not recovered within ``rebalance_window_s``, it goes on to quarantine;
b. quarantine: its maintenance reservation keeps new jobs off it, the running job goes on;
c. sweep once it is free (its job ended or was requeued): pass -> release, fail -> drain
   (the daemon's sweep runs over several passes: the node waits on it meanwhile);
   undetermined (its jobs measured nothing) -> it stays quarantined and is swept again after
   ``undetermined_retry_s`` (doubled each time), at most ``max_undetermined`` times, then left
   to an operator. No sweep starts while a fleet-wide finding covers the node (a thermal
   event must not drain the nodes it heats), nor while sweeps measured nothing on
   ``undetermined_fleet_nodes`` nodes within ``undetermined_window_s`` (the sweeps are
   broken, not the nodes: :func:`sweeps_broken`);
d. requeue (``[control] requeue = true``): a requeue-able job the ski-rental rule says is
   cheaper to restart elsewhere is requeued with the node excluded;
e. relapse: flagged again within ``relapse_window_s`` of a passed sweep: a longer sweep; the
   ``relapses``-th relapse gets one more (longest) sweep and is then drained as a lemon for
   repair even if it passes: the sweep's evidence goes with it to the repair ticket.

Nodes held by someone else, and nodes Slurm does not know, are left alone; structural and
transient findings get no node action; heterogeneity is handled by shares, never a drain.

A fabric finding (a leaf switch, an uplink, a spine group or a node's link at fault,
:mod:`guardctl.analyze.fabric`) takes no node action either: the nodes behind the component are
not swept, drained or quarantined for it, a sweep of a node the controller quarantined earlier
is held while it lasts, and none of them is a sweep partner. With ``[control]
fabric_quarantine`` its nodes in service are quarantined (:func:`fabric_plan`: no new jobs land
on them; capped like every quarantine), wait there while it lasts, and are released when it
clears (a node at fault on its own by then goes on with its own ladder instead).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from guardctl.analyze.fabric import FabricFinding
from guardctl.controller import rebalance, requeue
from guardctl.controller.classify import Classified, Finding, membership
from guardctl.controller.ladder import NodeLadder
from guardctl.nodeops.ownership import Owner
from guardctl.sections.control import ControlSettings
from guardctl.slurm.types import JobInfo

Act = Literal[
    "watch",
    "quarantine",
    "sweep",
    "drain",
    "requeue",
    "wait",
    "leave",
    "rebalance",
    "hold off",
    "release",
    "none",
]
ACTING = frozenset({"quarantine", "sweep", "drain", "requeue", "release"})


@dataclass(frozen=True)
class Decision:
    """What the controller chose for one node, on which rung, and why."""

    node: str
    action: Act
    rung: str
    why: str
    kind: str = ""
    jobs: tuple[int, ...] = ()
    duration_s: float = 0.0  # a sweep's GEMM seconds
    job: int | None = None  # the job a requeue is for
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def acts(self) -> bool:
        return self.action in ACTING

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "decision": self.action,
            "rung": self.rung,
            "why": self.why,
            "kind": self.kind,
            "jobs": list(self.jobs),
            "duration_s": self.duration_s,
            "job": self.job,
            **self.evidence,
        }


@dataclass(frozen=True)
class View:
    """Everything :func:`decide` looks at, gathered by the pass."""

    classified: Classified
    owners: Mapping[str, tuple[Owner, str]]
    running: Mapping[str, Sequence[JobInfo]]  # node -> the non-sweep jobs running on it
    ladders: Mapping[str, NodeLadder]
    now: float
    sweep_duration_s: float
    dds_jobs: frozenset[str] = frozenset()  # analysis job ids served by the data-sharding service
    requeueable: Mapping[int, float | None] = field(default_factory=dict)  # job -> seconds left
    data_end: float = 0.0  # end of the analysis's newest window (rung a's step times)
    unknown: frozenset[str] = frozenset()  # nodes in the telemetry or the log Slurm does not know
    sweeps_held: str = ""  # why no node is swept now (sweeps_broken), "" when they may be


def decide(view: View, cfg: ControlSettings) -> list[Decision]:
    """One decision per node that is flagged, that the controller holds, or that is in a
    guardctl quarantine reservation (whoever made it: none is left out of view)."""
    nodes = {f.node for f in view.classified.findings}
    nodes |= {n for n, lad in view.ladders.items() if lad.quarantined_by_control}
    nodes |= {n for n, (owner, _) in view.owners.items() if owner == "quarantined"}
    return [_node(view, cfg, node) for node in sorted(nodes)]


def _node(view: View, cfg: ControlSettings, node: str) -> Decision:
    finding = view.classified.of(node)
    ladder = view.ladders.get(node, NodeLadder(node))
    owner, owner_why = view.owners.get(node, ("in service", ""))
    jobs = tuple(j.job_id for j in view.running.get(node, ()))
    base: dict[str, Any] = {"kind": finding.kind if finding else "", "jobs": jobs}
    if node in view.unknown:  # nothing to hold or release there, and never "in service"
        return Decision(
            node,
            "leave",
            "-",
            "unknown to Slurm: not a node Slurm knows "
            "(a renamed or removed node, or a telemetry name that is not Slurm's); "
            "never touched",
            **base,
        )
    if owner == "held by someone else":
        return Decision(
            node, "leave", "-", f"held by someone else ({owner_why}): never touched", **base
        )
    if owner == "drained by guardctl":
        return Decision(node, "none", "-", f"already drained by guardctl ({owner_why})", **base)
    if owner == "quarantined":
        if not ladder.quarantined_by_control:
            return Decision(node, "leave", "-", "quarantined by an operator's sweep", **base)
        if ladder.fabric:
            held = _fabric_quarantined(view, node, finding, ladder, base)
            if held is not None:
                return held
        return _quarantined(view, cfg, node, finding, ladder, jobs)
    if finding is None:
        return Decision(node, "none", "-", "no longer flagged", **base)
    fabric = fabric_of(view.classified, node)
    if fabric is not None:
        return Decision(
            node, "none", "-", f"{fabric_line(fabric)}: the fabric, not the node", **base
        )
    if finding.kind == "fabric":  # the classifier's word, whatever finding it came with
        return Decision(node, "none", "-", f"fabric: {finding.why}", **base)
    if ladder.last_pass() is not None and finding.newest <= (ladder.last_pass() or 0.0):
        return Decision(
            node, "none", "-", "flagged only on data from before its sweep passed", **base
        )
    if finding.kind == "transient":
        return Decision(node, "watch", "-", f"transient: {finding.why}", **base)
    if finding.kind == "structural":
        return Decision(node, "none", "-", f"structural: {finding.why}", **base)
    if finding.kind == "heterogeneity":
        return Decision(
            node,
            "rebalance",
            "a",
            f"heterogeneity: {finding.why}",
            **base,
            evidence={"impact": finding.impact},
        )
    return _fault(view, cfg, node, finding, ladder, jobs)


def _fault(
    view: View,
    cfg: ControlSettings,
    node: str,
    finding: Finding,
    ladder: NodeLadder,
    jobs: tuple[int, ...],
) -> Decision:
    """A persistent node fault on a node in service: quarantine (a lemon's too: its last sweep
    gives the repair its evidence)."""
    base: dict[str, Any] = {"kind": finding.kind, "jobs": jobs}
    evidence: dict[str, Any] = {"finding": finding.why, "impact": finding.impact}
    flaps = ladder.onsets_since(view.now - cfg.flap_window_s)
    if flaps > cfg.max_flaps:
        return Decision(
            node,
            "hold off",
            "-",
            f"flapping: flagged anew {flaps} times in "
            f"{cfg.flap_window_s:g} s (control.max_flaps={cfg.max_flaps})",
            **base,
            evidence=evidence,
        )
    relapse = ladder.passes_since(view.now - cfg.relapse_window_s)
    if relapse == 0 and finding.job in view.dds_jobs and finding.job in map(str, jobs):
        taken, watched = _rung_a(view, cfg, node, finding, ladder, jobs)
        if taken is not None:
            return taken
        evidence["rebalance"] = watched  # not recovered, or nothing to check it on
    rung = "b" if relapse == 0 else "e"
    why = f"persistent node fault: {finding.why}"
    if relapse:
        why = f"relapse {relapse} of {cfg.relapses}: {why}"
    if "rebalance" in evidence:
        why = f"{why}; rung a: {evidence['rebalance']['why']}"
    if is_lemon(cfg, relapse):
        why = (
            f"lemon: flagged again after {relapse} passed sweep(s) within "
            f"{cfg.relapse_window_s:g} s, drained for repair after its last sweep, pass or "
            f"not: {finding.why}"
        )
    return Decision(
        node,
        "quarantine",
        rung,
        why + (f"; job(s) {', '.join(map(str, jobs))} go on undisturbed" if jobs else ""),
        **base,
        evidence={**evidence, "relapse": relapse, "lemon": is_lemon(cfg, relapse)},
    )


def _rung_a(
    view: View,
    cfg: ControlSettings,
    node: str,
    finding: Finding,
    ladder: NodeLadder,
    jobs: tuple[int, ...],
) -> tuple[Decision | None, dict[str, Any]]:
    """Rung a for a node whose running job the data-sharding service serves: take it (a watch
    of the job's step time), stay on it (watching, or recovered), or leave it for the next
    rung with the evidence (not recovered)."""
    base: dict[str, Any] = {"kind": finding.kind, "jobs": jobs}
    watch = rebalance.read(ladder.rebalance)
    if watch is None or watch.job != finding.job:
        watch = rebalance.start(finding.impact, view.now, view.data_end, cfg)
        if watch is None:
            return None, {
                "job": finding.job,
                "why": "the data-sharding service gives the slow "
                "rank less work, but no step records show the job's step time: "
                "nothing to check its recovery on",
            }
    elif watch.phase == "watch":
        watch = rebalance.check(watch, finding.impact, view.data_end, view.now, cfg)
    if watch.phase == "not recovered":
        return None, watch.as_dict()
    return Decision(
        node,
        "rebalance",
        "a",
        watch.why,
        **base,
        evidence={"impact": finding.impact, "rebalance": watch.as_dict()},
    ), {}


def fabric_findings(classified: Classified) -> tuple[FabricFinding, ...]:
    """The fabric findings of a classification, a node's link among them."""
    return classified.fabric


def covering(classified: Classified) -> tuple[FabricFinding, ...]:
    """The fabric findings that take their nodes off the node ladder: a switch's (leaf, uplink,
    spine). A node's link (its NIC, port, cable) is that node's fault, and its node stays on
    the ladder: the link finding only says what to reseat."""
    return tuple(f for f in classified.fabric if f.kind != "link")


def fabric_of(classified: Classified, node: str) -> FabricFinding | None:
    """The switch finding whose component carries *node*'s traffic, if any (the narrowest)."""
    return min(
        (f for f in covering(classified) if node in f.nodes),
        key=lambda f: len(f.nodes),
        default=None,
    )


def fabric_line(f: FabricFinding) -> str:
    """One line for a fabric finding: its component, nodes, confidence and first evidence."""
    first = f"; {f.evidence_for[0]}" if f.evidence_for else ""
    return (
        f"fabric {f.component} at fault ({len(f.nodes)} node(s) behind it, confidence "
        f"{f.confidence:.2f}{first})"
    )


@dataclass(frozen=True)
class FabricPlan:
    """The nodes behind a fabric finding to quarantine now (``[control] fabric_quarantine``)."""

    finding: FabricFinding
    nodes: tuple[str, ...]  # in service now; the others are held already or someone else's
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"component": self.finding.component, "nodes": list(self.nodes), "why": self.why}


def fabric_plan(view: View, cfg: ControlSettings) -> list[FabricPlan]:
    """Which nodes of each fabric finding to quarantine now: none unless
    ``fabric_quarantine``; only nodes in service that Slurm knows (a node someone else holds
    stays theirs, one guardctl holds already stays on its ladder)."""
    if not cfg.fabric_quarantine:
        return []
    out = []
    for f in covering(view.classified):
        nodes = tuple(
            n
            for n in f.nodes
            if n not in view.unknown and view.owners.get(n, ("", ""))[0] == "in service"
        )
        if nodes:
            out.append(
                FabricPlan(
                    f,
                    nodes,
                    f"{fabric_line(f)}: no new jobs on its nodes until it clears "
                    "(control.fabric_quarantine)",
                )
            )
    return out


def _fabric_quarantined(
    view: View, node: str, finding: Finding | None, ladder: NodeLadder, base: dict[str, Any]
) -> Decision | None:
    """A node the controller quarantined for a fabric finding: it waits while the finding
    lasts and is released when it clears; None: its own node fault now, the node ladder's."""
    evidence = {"fabric": ladder.fabric}
    now = next((f for f in covering(view.classified) if f.component == ladder.fabric), None)
    if now is not None:
        return Decision(
            node,
            "wait",
            "-",
            f"quarantined while {fabric_line(now)} lasts: not swept, released when it clears",
            **base,
            evidence=evidence,
        )
    if finding is not None and finding.kind == "persistent":
        return None  # at fault on its own now: the node ladder (swept when free)
    return Decision(
        node,
        "release",
        "-",
        f"fabric finding {ladder.fabric} cleared: released from its quarantine",
        **base,
        evidence=evidence,
    )


def is_lemon(cfg: ControlSettings, relapse: int) -> bool:
    """Whether a node on its *relapse*-th relapse is drained after its sweep whatever it shows."""
    return relapse >= cfg.relapses


def sweep_duration(view: View, cfg: ControlSettings, ladder: NodeLadder) -> tuple[float, int]:
    """A relapsing node's sweep is longer: ``relapse_sweep_factor`` per relapse."""
    relapse = ladder.passes_since(view.now - cfg.relapse_window_s)
    return view.sweep_duration_s * cfg.relapse_sweep_factor**relapse, relapse


def decide_node(view: View, cfg: ControlSettings, node: str) -> Decision:
    """The decision for one node (the controller's second look before it sweeps)."""
    return _node(view, cfg, node)


def sweeps_broken(ladders: Mapping[str, NodeLadder], now: float, cfg: ControlSettings) -> str:
    """Why no node may be swept now: sweeps that measured nothing on
    ``undetermined_fleet_nodes`` nodes within ``undetermined_window_s`` are the sweep harness's
    fault (a missing program, a broken Python, a full partition), not the nodes'; "" if not."""
    since = now - cfg.undetermined_window_s
    nodes = sorted(
        n
        for n, lad in ladders.items()
        if any(v == "undetermined" and ts >= since for ts, v in lad.sweeps)
    )
    if len(nodes) < cfg.undetermined_fleet_nodes:
        return ""
    named = ", ".join(nodes[:5]) + (f" (+{len(nodes) - 5} more)" if len(nodes) > 5 else "")
    return (
        f"sweeps measured nothing on {len(nodes)} nodes within "
        f"{cfg.undetermined_window_s:g} s ({named}): the sweep harness is broken, not the "
        "nodes (control.undetermined_fleet_nodes="
        f"{cfg.undetermined_fleet_nodes}); no sweep until that passes"
    )


def _fleet_finding(view: View, cfg: ControlSettings, node: str) -> str:
    """The fleet-wide finding (the fleet, the node's rack or its job), or the fabric finding,
    that covers *node*."""
    fabric = fabric_of(view.classified, node)
    if fabric is not None:  # its pairwise all-reduce would fail for the switch, not the node
        return fabric_line(fabric)
    for f in view.classified.fleet:
        if f.scope in ("stage", "slowdown"):  # a job's own finding: reported, it holds nothing
            continue
        if (
            f.scope == "fleet"
            or node in f.nodes
            or (f.scope == "rack" and membership(cfg.racks).get(node) == f.name)
        ):
            return f.why
    return ""


def _sweep_held(
    view: View, cfg: ControlSettings, node: str, ladder: NodeLadder, rung: str, base: dict[str, Any]
) -> Decision | None:
    """A quarantined, free node whose sweep must not start now: why, or None."""
    if view.sweeps_held:
        return Decision(node, "wait", rung, f"quarantined, sweep held: {view.sweeps_held}", **base)
    fleet = _fleet_finding(view, cfg, node)
    if fleet:
        return Decision(
            node,
            "wait",
            rung,
            f"quarantined, sweep held during a fleet-wide finding: {fleet}",
            **base,
        )
    tried = ladder.undetermined()
    last = ladder.last_sweep_why or "no figure"
    if len(tried) >= cfg.max_undetermined:
        return Decision(
            node,
            "hold off",
            rung,
            f"quarantined: {len(tried)} sweep(s) measured "
            f"nothing (control.max_undetermined={cfg.max_undetermined}; the last: "
            f"{last}); left quarantined for an operator",
            **base,
        )
    if tried:
        due = tried[-1] + cfg.undetermined_retry_s * 2 ** (len(tried) - 1)
        if view.now < due:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(due))
            return Decision(
                node,
                "wait",
                rung,
                f"quarantined, {len(tried)} sweep(s) measured "
                f"nothing ({last}); swept again after {when}",
                **base,
                evidence={"retry_at": due},
            )
    return None


def _quarantined(
    view: View,
    cfg: ControlSettings,
    node: str,
    finding: Finding | None,
    ladder: NodeLadder,
    jobs: tuple[int, ...],
) -> Decision:
    """A node the controller quarantined: sweep it when free, else wait (or requeue)."""
    base: dict[str, Any] = {"kind": finding.kind if finding else "", "jobs": jobs}
    duration, relapse = sweep_duration(view, cfg, ladder)
    if ladder.sweeping:  # the daemon polls it at each pass
        return Decision(
            node,
            "wait",
            "e" if relapse else "c",
            f"quarantined, its sweep {ladder.sweeping.get('sweep')} runs",
            **base,
            evidence={"sweep": ladder.sweeping.get("sweep")},
        )
    if not jobs:
        rung = "e" if relapse else "c"
        held = _sweep_held(view, cfg, node, ladder, rung, base)
        if held is not None:
            return held
        lemon = is_lemon(cfg, relapse)
        return Decision(
            node,
            "sweep",
            rung,
            f"quarantined and free: sweep ({duration:g} s"
            + (f", relapse {relapse}" if relapse else "")
            + ("; a lemon: drained after it, pass or not" if lemon else "")
            + ")",
            **base,
            duration_s=duration,
            evidence={"relapse": relapse, "lemon": lemon},
        )
    impact = finding.impact if finding else None
    if cfg.requeue and impact:
        for job in jobs:
            if job not in view.requeueable:
                continue
            since = ladder.episode_start() or ladder.quarantined_at or view.now
            rental = requeue.decide(
                float(impact["pct"]) / 100,
                int(impact["gpus"]),
                view.now - since,
                view.requeueable[job],
                cfg,
            )
            if rental.requeue:
                return Decision(
                    node,
                    "requeue",
                    "d",
                    f"job {job}: {rental.why}",
                    **base,
                    job=job,
                    evidence={"rental": rental.as_dict(), "impact": impact},
                )
            return Decision(
                node,
                "wait",
                "b",
                f"quarantined, job {job} runs on: {rental.why}",
                **base,
                evidence={"rental": rental.as_dict(), "impact": impact},
            )
    return Decision(
        node,
        "wait",
        "b",
        f"quarantined: waiting for job(s) {', '.join(map(str, jobs))} to end before the sweep",
        **base,
        evidence={"impact": impact} if impact else {},
    )
