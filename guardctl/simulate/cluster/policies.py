"""The mitigation policies compared, on the same seeds.

* ``none``: no mitigation. Slurm itself marks a crashed host down and requeues its job; a
  node whose GPU is lost but whose slurmd lives stays in service, hanging job after job, until
  an operator notices it (``notice_s``).
* ``failstop``: fail-stop health checks only (what NHC and a prolog do): a lost GPU drains
  the node at the next check; grey and slow nodes go unseen.
* ``guard``: a Guard-style baseline written for this comparison: health checks, and a
  detector that compares every rank with all of its job's (no pipeline stages, no notion of
  host contention); a flagged node is quarantined (its job runs on; no new job lands on it,
  and a job that restarts for any reason restarts without it), swept once free: fail drains
  it, pass releases it.
* ``guardctl``: health checks plus guardctl's own controller: :func:`guardctl.controller.
  policy.decide` (with the real ski-rental rule, :mod:`guardctl.controller.requeue`) on the
  real ladder (:func:`guardctl.controller.ladder.derive` over the action-log entries this
  adapter writes), the data-sharding service giving a flagged node's ranks less work, and
  guardctl's stage-aware analyzer represented by its measured delay and recall.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

from guardctl.actionlog import Entry
from guardctl.controller import policy as control
from guardctl.controller.classify import Classified, Finding
from guardctl.controller.ladder import BY, FRESH_START, NodeLadder, derive
from guardctl.nodeops.ownership import Owner
from guardctl.sections.control import ControlSettings
from guardctl.simulate.cluster.engine import Cluster, Flag, Policy
from guardctl.slurm.types import JobInfo

NAMES = ("none", "failstop", "guard", "guardctl")


class NoMitigation:
    """Nothing but Slurm's own handling of a crashed node."""

    name, health_checks, rebalances = "none", False, False

    def on_pass(self, sim: Cluster) -> None:
        pass

    def on_sweep(self, sim: Cluster, node: str, verdict: str) -> None:
        sim.release(node)


class FailStop(NoMitigation):
    """Fail-stop health checks (NHC, a prolog): lost GPUs are drained, slow nodes unseen."""

    name, health_checks = "failstop", True


class GuardStyle(FailStop):
    """Detect, quarantine, sweep when free, drain on a failed sweep (see the module)."""

    name = "guard"

    def on_pass(self, sim: Cluster) -> None:
        for flag in sim.flagged(stage_aware=False):
            sim.quarantine(flag.node)
        for node in sorted(sim.quarantined):
            if node not in sim.node_job:
                sim.sweep(node, sim.p.sweep_s)

    def on_sweep(self, sim: Cluster, node: str, verdict: str) -> None:
        if verdict == "fail":
            sim.drain(node, "guardctl")
        else:
            sim.release(node)


class Guardctl(FailStop):
    """guardctl's controller, its decisions from :func:`guardctl.controller.policy.decide`."""

    name, rebalances = "guardctl", True

    def __init__(self, cfg: ControlSettings) -> None:
        self.cfg = cfg
        self.log: dict[str, list[Entry]] = {}  # node -> its action-log entries, oldest first
        self.flagged: set[str] = set()
        self.passed: set[str] = set()  # nodes with passed sweeps since their last fresh start
        self.actions: deque[float] = deque()  # when the controller acted, for its hourly cap
        self.seq = 0

    # -- the action log the real ladder is read from ----------------------------------------
    def note(self, sim: Cluster, node: str, action: str, phase: str = "note",
             nodes: tuple[str, ...] | None = None, **evidence: Any) -> None:
        self.seq += 1
        self.log.setdefault(node, []).append(Entry(
            str(self.seq), sim.now, action, phase, (node,) if nodes is None else nodes,
            evidence=evidence))

    def ladder(self, node: str) -> NodeLadder:
        return derive(self.log.get(node, [])).get(node, NodeLadder(node))

    # -- one pass ----------------------------------------------------------------------------
    def on_pass(self, sim: Cluster) -> None:
        flags = sim.flagged(stage_aware=True)
        for flag in flags:
            job = sim.jobs[flag.job]
            if flag.kind == "persistent" and job.large:
                sim.rebalance(job, flag.node)  # the data-sharding service, on its own
        faulty = {f.node for f in flags if f.kind == "persistent"}
        for node in sorted(faulty ^ self.flagged):  # "control pass": the set at fault changed
            self.note(sim, node, "control pass", nodes=(node,) if node in faulty else ())
        self.flagged = faulty
        self.fresh_starts(sim)
        held = sorted(sim.quarantined)
        if not flags and not held:
            return
        view = self.view(sim, flags, held)
        for decision in control.decide(view, self.cfg):
            if decision.acts:
                self.act(sim, decision, view)

    def fresh_starts(self, sim: Cluster) -> None:
        """As the real pass: a passed node someone else holds now starts its relapses over."""
        for node in sorted(self.passed):
            # The model's nodes held by someone else are all drained or down: out for repair.
            if self.ladder(node).needs_fresh_start(self.owner(sim, node)[0], True):
                self.note(sim, node, FRESH_START)
                self.passed.discard(node)

    def view(self, sim: Cluster, flags: list[Flag], held: list[str]) -> control.View:
        nodes = sorted({f.node for f in flags} | set(held))
        findings = tuple(self.finding(sim, f) for f in flags)
        running: dict[str, list[JobInfo]] = {}
        requeueable: dict[int, float | None] = {}
        for node in nodes:
            job_id = sim.node_job.get(node)
            if job_id is None:
                continue
            job = sim.jobs[job_id]
            running[node] = [JobInfo(job_id, "train" if job.large else "batch", "root",
                                     "RUNNING", tuple(job.nodes), requeue=True)]
            requeueable[job_id] = None if job.large else (job.eta() - sim.now)
        ladders = {n: self.ladder(n) for n in nodes}
        owners = {n: self.owner(sim, n) for n in nodes}
        dds = frozenset(str(f.job) for f in flags if sim.jobs[f.job].large)
        return control.View(Classified(findings), owners, running, ladders, sim.now,
                            sim.p.sweep_s, dds, requeueable)

    def finding(self, sim: Cluster, flag: Flag) -> Finding:
        job = sim.jobs[flag.job]
        without = sim.without(job, flag.node)
        pct = 100.0 * max(0.0, job.factor - without) / job.factor
        impact = {"job": str(flag.job), "pct": round(pct, 3), "gpus": job.gpus}
        detector = "host_contention" if flag.cause == "contention" else "busy_time"
        return Finding(flag.node, "transient" if flag.kind == "transient" else "persistent",
                       f"{detector}: {job.factor:.2f}x step time", str(flag.job), (detector,),
                       impact=impact, newest=sim.now)

    @staticmethod
    def owner(sim: Cluster, node: str) -> tuple[Owner, str]:
        by = sim.drained.get(node)
        if by == "guardctl":
            return "drained by guardctl", "control"
        if by is not None or node in sim.down:
            return "held by someone else", by or "down"
        if node in sim.quarantined:
            return "quarantined", "control"
        return "in service", ""

    # -- acting ---------------------------------------------------------------------------------
    def act(self, sim: Cluster, d: control.Decision, view: control.View) -> None:
        while self.actions and self.actions[0] < sim.now - 3600:
            self.actions.popleft()
        if len(self.actions) >= self.cfg.max_actions_per_hour:
            return  # as the real loop: skipped past control.max_actions_per_hour
        self.actions.append(sim.now)
        if d.action == "quarantine":
            sim.quarantine(d.node)
            self.note(sim, d.node, "quarantine", "done", by=BY)
            if d.node not in sim.node_job:
                fresh = dataclasses.replace(view, now=sim.now)
                duration, _ = control.sweep_duration(fresh, self.cfg, self.ladder(d.node))
                sim.sweep(d.node, duration)
        elif d.action == "sweep":
            sim.sweep(d.node, d.duration_s)
        elif d.action == "drain":
            self.drain(sim, d.node)
        elif d.action == "requeue" and d.job is not None and sim.jobs[d.job].running:
            sim.requeue(sim.jobs[d.job], (d.node,))  # not twice when two of its nodes ask

    def drain(self, sim: Cluster, node: str) -> None:
        sim.drain(node, "guardctl")
        self.note(sim, node, "drain", "done", by=BY)

    def on_sweep(self, sim: Cluster, node: str, verdict: str) -> None:
        relapse = self.ladder(node).passes_since(sim.now - self.cfg.relapse_window_s)
        self.note(sim, node, "control sweep", verdict=verdict)
        # As the real loop: a lemon's last sweep is followed by its drain, pass or not.
        if verdict == "fail" or control.is_lemon(self.cfg, relapse):
            self.drain(sim, node)
        else:
            self.passed.add(node)
            sim.release(node)
            self.note(sim, node, "release", "done", by=BY)


def make(name: str, cfg: ControlSettings | None = None) -> Policy:
    """The policy called *name* (one of :data:`NAMES`)."""
    if name == "guardctl":
        return Guardctl(cfg or ControlSettings(requeue=True))
    plain: dict[str, type[NoMitigation]] = {"none": NoMitigation, "failstop": FailStop,
                                            "guard": GuardStyle}
    return plain[name]()
