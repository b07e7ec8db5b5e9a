"""One controller pass (read, decide, act, record) and the daemon that repeats it.

A pass: take or renew the leader lease (a second controller observes and says so); close
intents a crash left (:meth:`NodeOps.reconcile`); read the newest analysis, Slurm's nodes,
reservations and jobs, and the action log; classify and decide (pure, :mod:`policy`); then act
through the node-action door and the sweep, or, observing only, record what it would do.

The daemon does not wait for a sweep: a pass starts it (its first batch of jobs submitted)
and the passes after it poll it, submitting its next batch or judging it once its jobs ended
(:mod:`guardctl.controller.sweeps`), so the fleet is watched meanwhile. A sweep open in the log
that this process does not run (its daemon gone) is aborted by the leader and the node swept
afresh; a daemon that loses the lease or stops aborts its own. One pass (``--once``) still runs
its sweep to the end inside the pass: the sweep's progress callback renews the lease between
its polls, and stops the sweep (the node left quarantined) if the lease was lost.

Slurm unreachable mid-pass: the pass stops with :class:`SlurmUnavailable`; each node action was
logged as an intent first, so nothing is half done that the next pass cannot reconcile.

The analysis comes from the telemetry source ``[source]`` names: guardctl's store (through the
incremental analyzer) or Prometheus (the exporters' series, mixed with the store's
``source.store_kinds``). It is read first, once per pass: a source that gives no complete answer
(:class:`~guardctl.sources.SourceError`) stops the pass before it reconciles, decides or acts.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl import layout
from guardctl.actionlog import Entry
from guardctl.analyze.allocator import keep_freed_memory
from guardctl.analyze.engine import Analysis
from guardctl.analyze.incremental import Analyzer
from guardctl.config import Settings
from guardctl.controller import policy, record
from guardctl.controller.classify import Classified, classify
from guardctl.controller.impact import describe
from guardctl.controller.ladder import BY, SWEEPING, NodeLadder, derive
from guardctl.controller.lease import Holder, Lease, LeaseLost
from guardctl.controller.sweeps import InFlight, Sweeps
from guardctl.errors import RefusedError, SlurmError
from guardctl.nodeops import NodeOps
from guardctl.nodeops.ownership import NODE_ACTIONS
from guardctl.slurm.types import JobInfo, SlurmClient
from guardctl.sources import Source, SourceError, analyze_source, open_source
from guardctl.sweep.engine import SweepOptions, SweepReport, run_sweep

Progress = Callable[[str], None]
LIVE = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"})


def newest_analysis(source: Source, analyzer: Analyzer) -> Analysis:
    """The analysis the controller decides on (the one place the controller reads it).

    From the store, the incremental analyzer gives what ``analyze.engine.analyze`` gives,
    reading only what was written since the previous pass: a daemon keeps one and each pass
    costs what is new. From Prometheus, the pass ``guardctl analyze`` makes (the exporters'
    series of the span the analysis needs, ending now, with the store's ``source.store_kinds``):
    Prometheus has no cursor to tail, so each pass asks for the whole span again. A source that
    fails raises :class:`SourceError`, never an analysis of what it did give.
    """
    if source.url:
        return analyze_source(source)
    return analyzer.analyze()


@dataclass
class PassReport:
    """What one pass saw, chose and did."""

    leader: bool
    acting: bool
    holder: dict[str, Any] | None = None
    window: tuple[float, float] | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    fleet: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    reconciled: int = 0
    source: dict[str, Any] | None = None  # what a Prometheus source gave (None: the store)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Gathered:
    """The inputs of one decision round, read once."""

    analysis: Analysis
    classified: Classified
    entries: list[Entry]
    ladders: dict[str, NodeLadder]
    view: policy.View
    out_for_repair: Callable[[str], bool]  # drained, down, rebooting (whoever holds it)


@dataclass(frozen=True)
class Swept:
    """What the decision that started a sweep knew, for its record once judged."""

    node: str
    duration_s: float
    relapse: int
    lemon: bool
    why: str


def running_jobs(jobs: list[JobInfo]) -> dict[str, list[JobInfo]]:
    """node -> the jobs running on it, guardctl's own sweep jobs left out."""
    out: dict[str, list[JobInfo]] = {}
    for job in jobs:
        if job.state in LIVE and not job.name.startswith("guardctl-"):
            for node in job.nodes:
                out.setdefault(node, []).append(job)
    return out


def gather(settings: Settings, ops: NodeOps, analysis: Analysis, now: float) -> Gathered:
    """Read Slurm and the action log beside *analysis*; build the policy's view."""
    classified = classify(analysis, settings.control)
    snap = ops.snapshot()
    jobs = ops.slurm.jobs()
    entries = ops.log.entries()
    ladders = derive(entries)
    owners = {n: ops.owner(snap, n) for n in snap.nodes}
    root = settings.store.root
    dds = frozenset(f.job for f in classified.findings if f.job and _serves(root, f.job))
    requeueable = {j.job_id: (j.end_time - now if j.end_time else None)
                   for j in jobs if j.requeue and j.state == "RUNNING"}
    duration = settings.control.sweep_duration_s or settings.sweep.gemm_duration_s
    view = policy.View(classified, owners, running_jobs(jobs), ladders, now, duration, dds,
                       requeueable, analysis.window_end)
    return Gathered(analysis, classified, entries, ladders, view, snap.out_for_repair)


def _serves(root: Path, job: str) -> bool:
    """Whether the data-sharding service runs for *job* (its directory in the store)."""
    try:
        return layout.dds_dir(root, job).is_dir()
    except (OSError, ValueError):
        return False


class Controller:
    """The mitigation loop over one store and one Slurm."""

    def __init__(self, settings: Settings, *, act: bool, slurm: SlurmClient | None = None,
                 progress: Progress = lambda _m: None) -> None:
        self.settings = settings
        self.cfg = settings.control
        self.acting = act and not settings.safety.observe_only
        self.ops = NodeOps(settings, slurm)
        self.lease = Lease(settings.store.root, self.cfg.lease_s)
        self.source = open_source(settings, None, None, self.ops.slurm)  # its jobs: same Slurm
        self.analyzer = Analyzer(settings)  # one pass judges up to the newest record
        self.progress = progress
        self.polled = False  # the daemon: sweeps run across passes (see the module docstring)
        self.sweeps = Sweeps(self.ops, progress)

    def as_daemon(self, interval_s: float) -> None:
        """Passes follow each other every *interval_s* from now on: sweeps run across passes,
        and with ``[control] align`` the windows end on a multiple of the interval, so that a
        window one pass judged is judged again unchanged a window length later and the
        analyzer keeps its figures. A single pass (``--once``) judges up to the newest record:
        aligning it would only hide the newest minute, as nothing is kept after it."""
        self.polled = True
        if self.cfg.align:
            self.analyzer.grid_s = interval_s

    def analysis(self) -> Analysis:
        """This pass's analysis, from the configured source (raises SourceError)."""
        return newest_analysis(self.source, self.analyzer)

    def _source_seen(self) -> dict[str, Any] | None:
        cov = self.source.coverage
        return cov.to_dict() if self.source.url and cov is not None else None

    # -- the lease -------------------------------------------------------------------------
    def lead(self) -> tuple[bool, Holder | None]:
        return self.lease.acquire()

    def _renew(self, message: str) -> None:
        held, holder = self.lease.acquire()
        if not held:
            raise LeaseLost(f"lost the controller lease to {_who(holder)}; stopping the sweep "
                            "(the node stays quarantined for the next leader)")
        self.progress(message)

    # -- one pass ---------------------------------------------------------------------------
    def run_pass(self, dry_run: bool = False) -> PassReport:
        """Lead, read, decide, act (or record what it would do); see the module docstring."""
        if not dry_run:
            held, holder = self.lead()
            if not held:
                if self.sweeps.running:
                    self.sweeps.abort_all(f"lost the controller lease to {_who(holder)}")
                return PassReport(False, False, holder.as_dict() if holder else None)
        analysis = self.analysis()  # first: a source that fails leaves the pass doing nothing
        now = time.time()
        reconciled = [] if dry_run else self.ops.reconcile()
        if self.acting and not dry_run:  # observing only: not even its own sweeps' jobs
            self._sweeps_in_flight()
        g = gather(self.settings, self.ops, analysis, now)
        report = PassReport(True, self.acting and not dry_run, reconciled=len(reconciled),
                            window=(g.analysis.window_start, g.analysis.window_end),
                            findings=[f.as_dict() for f in g.classified.findings],
                            fleet=[f.as_dict() for f in g.classified.fleet],
                            source=self._source_seen())
        if not dry_run:
            record.record_pass(self.ops, g.entries, g.classified)
            record.record_fleet(self.ops, g.entries, g.classified)
            record.record_fresh_starts(self.ops, g.ladders, g.view.owners, g.out_for_repair)
        for decision in policy.decide(g.view, self.cfg):
            if not dry_run:  # rung a's watch is a record, observing only or not
                record.record_rebalance(self.ops, decision, g.ladders.get(decision.node))
            outcome, extra = self._carry_out(decision, g, dry_run)
            if not dry_run and (decision.acts or record.changed(
                    decision, g.ladders.get(decision.node), outcome)):
                record.record_decision(self.ops, decision, outcome, extra)
            report.decisions.append({**decision.as_dict(), "outcome": outcome, **extra})
        return report

    def _carry_out(self, d: policy.Decision, g: Gathered,
                   dry_run: bool) -> tuple[str, dict[str, Any]]:
        if not d.acts:
            return "", {}
        if dry_run or not self.acting:
            return "would do", {}
        used = self._actions_last_hour()
        if used >= self.cfg.max_actions_per_hour:
            return (f"skipped: {used} controller action(s) in the last hour "
                    f"(control.max_actions_per_hour={self.cfg.max_actions_per_hour})"), {}
        try:
            return self._act(d, g)
        except RefusedError as exc:
            return f"refused: {exc}", {}
        except LeaseLost:
            raise
        except SlurmError:
            raise  # the pass stops here; the intent log lets the next one reconcile

    def _act(self, d: policy.Decision, g: Gathered) -> tuple[str, dict[str, Any]]:
        evidence = {"by": BY, "decision": d.action, "rung": d.rung, "kind": d.kind,
                    "jobs": list(d.jobs), **{k: v for k, v in d.evidence.items()
                                             if k in ("impact", "relapse", "rebalance")}}
        if d.action == "quarantine":
            self.ops.quarantine([d.node], f"control: {d.why}", evidence=evidence)
            if not d.jobs:  # free already: straight on to the sweep
                # the same analysis (one read of the source per pass), Slurm and the log anew
                fresh = gather(self.settings, self.ops, g.analysis, time.time())
                ladder = fresh.ladders.get(d.node, NodeLadder(d.node))
                duration, relapse = policy.sweep_duration(fresh.view, self.cfg, ladder)
                return self._sweep(d.node, duration, relapse, d.why)
            return "done", {}
        if d.action == "sweep":
            return self._sweep(d.node, d.duration_s, int(d.evidence.get("relapse", 0)), d.why)
        if d.action == "drain":
            self.ops.drain([d.node], f"control: {d.why}", evidence=evidence)
            return "done", {}
        if d.action == "requeue" and d.job is not None:
            return self._requeue(d)
        return "", {}

    def _sweep(self, node: str, duration: float, relapse: int,
               why: str) -> tuple[str, dict[str, Any]]:
        lemon = policy.is_lemon(self.cfg, relapse)
        options = SweepOptions(kind=self.cfg.sweep_kind, duration_s=duration,
                               release_passed=not lemon)
        self.progress(f"control: sweeping {node} ({self.cfg.sweep_kind}, {duration:g} s)")
        if self.polled:
            flight = self.sweeps.start(self.settings, node, options, relapse, lemon, why)
            report = self.sweeps.poll(flight)
            if report is None:  # its first batch submitted
                return "sweep started", {"sweep": flight.sweep_id}
            return self._swept(flight, report)
        report = run_sweep(self.settings, [node], options, ops=self.ops, progress=self._renew)
        return self._swept(Swept(node, duration, relapse, lemon, why), report)

    def _sweeps_in_flight(self, clean_up: bool = True) -> None:
        """Poll the sweeps this daemon runs (judged ones are recorded and acted on), and abort
        those open in the log that no process here runs any more (*clean_up*: a pass)."""
        self.sweeps.retry()
        for flight in list(self.sweeps.running.values()):
            try:
                report = self.sweeps.poll(flight)
                if report is not None:
                    self._swept(flight, report)
            except RefusedError as exc:  # aborted and closed; the node stays quarantined
                self.progress(f"control: sweep {flight.sweep_id} of {flight.node}: {exc}")
        if clean_up:
            entries = self.ops.log.entries()
            self.sweeps.clean_up(derive(entries), entries)

    def _swept(self, flight: Swept | InFlight, report: SweepReport) -> tuple[str, dict[str, Any]]:
        """Record a judged sweep; a lemon that passed is drained all the same."""
        node, relapse, lemon, why = flight.node, flight.relapse, flight.lemon, flight.why
        verdict = report.verdicts[0]
        self.ops.record("control sweep", [node], reason=verdict.evidence, evidence={
            "verdict": verdict.verdict, "action": verdict.action, "sweep": report.sweep_id,
            "duration_s": flight.duration_s, "relapse": relapse, "lemon": lemon,
            "background": self.polled})
        if lemon and verdict.verdict == "pass":
            # Relapsing after every passed sweep: the burn-in cannot see its fault, the jobs can.
            self.ops.drain([node], f"control: lemon after relapse {relapse}, its sweep passed "
                           f"({verdict.evidence})", evidence={
                               "by": BY, "decision": "drain", "rung": "e", "relapse": relapse,
                               "sweep": report.sweep_id, "why": why})
            return "swept: pass, drained as a lemon", {"sweep": report.sweep_id}
        return f"swept: {verdict.verdict}, {verdict.action}", {"sweep": report.sweep_id}

    def _requeue(self, d: policy.Decision) -> tuple[str, dict[str, Any]]:
        from guardctl.slurm.job import Job

        assert d.job is not None
        job = Job(self.ops.slurm, d.job)
        self.ops.record("control requeue", [d.node], reason=d.why, evidence={
            "phase": "intent", "job": d.job, "exclude": [d.node], **d.evidence})
        if self.cfg.signal:
            job.signal(self.cfg.signal)
            time.sleep(self.cfg.signal_grace_s)
        job.requeue(exclude=[d.node])
        self.ops.record("control requeue", [d.node], reason=d.why, evidence={
            "phase": "done", "job": d.job, "exclude": [d.node], "signal": self.cfg.signal})
        return "done", {}

    def _actions_last_hour(self) -> int:
        hour_ago = self.ops.clock() - 3600
        return sum(1 for e in self.ops.log.entries() if e.ts >= hour_ago and counts_toward_cap(e))

    # -- between passes (the daemon) --------------------------------------------------------
    def pause_s(self) -> float:
        """How long the daemon sleeps between looks: the lease's renewal, or a sweep's poll."""
        pause = self.cfg.lease_s / 3
        if self.sweeps.running or self.sweeps.leftover:
            pause = min(pause, self.settings.sweep.poll_interval_s)
        return pause

    def tick(self) -> None:
        """Poll the daemon's sweeps in flight (the leader, between passes)."""
        if self.sweeps.running or self.sweeps.leftover:
            self._sweeps_in_flight(clean_up=False)  # the log is read at the next pass

    # -- explain ----------------------------------------------------------------------------
    def explain(self, node: str) -> dict[str, Any]:
        """Why the controller chooses what it chooses for *node*, from a read-only round."""
        self.ops.snapshot().known([node])
        g = gather(self.settings, self.ops, self.analysis(), time.time())
        decision = next((d for d in policy.decide(g.view, self.cfg) if d.node == node), None)
        finding = g.classified.of(node)
        verdict = g.analysis.verdict_of(node)
        return {
            "node": node,
            "verdict": verdict.to_dict() if verdict else None,
            "finding": finding.as_dict() if finding else None,
            "impact": describe(node, finding.impact if finding else None),
            "decision": decision.as_dict() if decision else None,
            "owner": list(g.view.owners.get(node, ("in service", ""))),
            "jobs": [j.job_id for j in g.view.running.get(node, ())],
            "ladder": g.ladders.get(node, NodeLadder(node)).as_dict(),
            "fleet": [f.as_dict() for f in g.classified.fleet if node in f.nodes],
            "history": [e.as_dict() for e in g.entries
                        if node in e.nodes and e.action.startswith("control")][-10:],
        }


def _who(holder: Holder | None) -> str:
    if holder is None:
        return "nobody"
    return f"pid {holder.pid} on {holder.host}"


def holder_line(report: PassReport) -> str:
    """The line a controller that is not the leader prints."""
    h = report.holder or {}
    left = max(0.0, float(h.get("expires", 0.0)) - time.time())
    return (f"another controller leads (pid {h.get('pid')} on {h.get('host')}, lease "
            f"{left:.0f} s left): observing, not acting")


def serve(controller: Controller, interval_s: float, emit: Callable[[PassReport], None],
          warn: Callable[[str], None]) -> None:
    """Run passes every *interval_s* until interrupted, renewing the lease in between.

    Slurm down, the store unwritable or the telemetry source failing for a pass: one line, and
    the next pass carries on (a pass whose source failed decided and did nothing).
    The lease is given up on the way out, so another controller need not wait for it to expire.
    """
    from guardctl.errors import GuardctlError

    controller.as_daemon(interval_s)
    # A pass after pass in this process: the memory one frees serves the next, rather than
    # going back to the kernel and coming back as fresh pages (guardctl.analyze.allocator).
    keep_freed_memory()
    try:
        while True:
            leader = False
            try:
                report = controller.run_pass()
                leader = report.leader
                emit(report)
            except LeaseLost as exc:
                warn(str(exc))
            except SourceError as exc:
                warn("no analysis this pass, nothing decided or done; the next one carries on: "
                     f"{' '.join(str(exc).split())}")
            except GuardctlError as exc:
                warn(f"pass failed, the next one carries on: {' '.join(str(exc).split())}")
            deadline = time.monotonic() + interval_s
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, controller.pause_s()))
                if leader and deadline - time.monotonic() > 0:
                    leader = controller.lead()[0]
                    if leader:
                        _between(controller, warn)
    finally:
        try:
            controller.sweeps.abort_all("the controller stopped")
        finally:
            controller.lease.release()


def _between(controller: Controller, warn: Callable[[str], None]) -> None:
    """Between passes, the leader polls its sweeps: a batch's end starts the next one."""
    from guardctl.errors import GuardctlError

    try:
        controller.tick()
    except GuardctlError as exc:
        warn(f"sweep poll failed, the next pass carries on: {' '.join(str(exc).split())}")


def counts_toward_cap(e: Entry) -> bool:
    """Whether a log entry is one of the controller's own actions that
    ``control.max_actions_per_hour`` counts: a node action it took, a requeue, a sweep."""
    node_action = e.phase == "done" and e.action in NODE_ACTIONS and e.evidence.get("by") == BY
    requeued = e.action == "control requeue" and e.evidence.get("phase") == "done"
    # a daemon's sweep counts when it starts, one pass's when it is judged
    swept = e.action == SWEEPING or (e.action == "control sweep"
                                      and not e.evidence.get("background"))
    return node_action or requeued or swept
