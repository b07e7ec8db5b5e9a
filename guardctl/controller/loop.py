"""One controller pass (read, decide, act, record) and the daemon that repeats it.

A pass: take or renew the leader lease (a second controller observes and says so; every change
to Slurm and every log entry after it is fenced by the lease, :mod:`~guardctl.controller.fence`);
observe only for this pass when an agent's clock is too far from this host's
(:mod:`guardctl.clock`); close intents a crash left (:meth:`NodeOps.reconcile`); read the
newest analysis, Slurm's nodes, reservations and jobs, and the action log; classify and decide
(pure, :mod:`policy`); then act through the node-action door and the sweep, or, observing only,
record what it would do (observe-only walks the whole ladder on paper:
:mod:`~guardctl.controller.rehearsal`).
A sweep starts only after a second look (Slurm and the log read again): what landed since the
read (a user's job, an operator's quarantine) makes the node wait or leaves it to its owner.

The daemon does not wait for a sweep: a pass starts it (its first batch of jobs submitted)
and the passes after it poll it, submitting its next batch or judging it once its jobs ended
(:mod:`guardctl.controller.sweeps`), so the fleet is watched meanwhile. A sweep open in the log
that this process does not run (its daemon gone) is aborted by the leader and the node swept
afresh; a daemon that stops aborts its own, one that lost the lease leaves them to the leader.
One pass (``--once``) still runs its sweep to the end inside the pass: the sweep's progress
callback renews the lease between its polls, and stops the sweep (the node left quarantined) if
the lease was lost.

The cluster's network tree (:func:`guardctl.topology.load_topology`: ``[control] racks``, or
Slurm's topology plugin) is read at most once a minute and handed to the classifier, which
names a fabric component (a leaf switch, an uplink, a spine group, a node's link) where the
nodes at fault share one; a fabric finding takes no node action (:mod:`policy`), is noted in
the log once while it lasts and again when it clears (``control fabric``), and with ``[control]
fabric_quarantine`` its nodes are quarantined until it clears. A tree that cannot be read:
the pass goes on with ``[control] racks`` alone and says so in one line.

Slurm unreachable mid-pass: the pass stops with :class:`SlurmUnavailable`; each node action was
logged as an intent first, so nothing is half done that the next pass cannot reconcile.

The analysis comes from the telemetry source ``[source]`` names: guardctl's store (through the
incremental analyzer) or Prometheus (the exporters' series, mixed with the store's
``source.store_kinds``). It is read first, once per pass: a source that gives no complete answer
(:class:`~guardctl.errors.SourceError`) stops the pass before it reconciles, decides or acts;
a window that ended long before now (stale) or ends after it
(:func:`~guardctl.analyze.engine.out_of_date`) is reported, said in one line, and nothing is
decided on it. One decision's error never stops the others; Slurm down and a lost lease do.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl.actionlog import Entry
from guardctl.analyze.engine import Analysis, ahead_line, out_of_date
from guardctl.analyze.impact import describe
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.load import is_store
from guardctl.clock import Clock, skew_refusal
from guardctl.config import Settings, check_lease
from guardctl.controller import policy, record, rehearsal
from guardctl.controller.classify import Classified, classify
from guardctl.controller.fabric import open_fabric
from guardctl.controller.fence import FencedLog, FencedSlurm
from guardctl.controller.ladder import BY, FABRIC, SWEEPING, NodeLadder, derive
from guardctl.controller.lease import Holder, Lease, LeaseLost
from guardctl.controller.sweeps import InFlight, Sweeps, record_sweep_fabric
from guardctl.errors import (
    GuardctlError,
    RefusedError,
    SlurmError,
    SlurmUnavailable,
    SourceError,
    UsageError,
)
from guardctl.limits import CONTROLLER_OPEN_FILES, raise_open_files_limit
from guardctl.nodeops import NodeOps
from guardctl.nodeops.ownership import NODE_ACTIONS, REQUEUE
from guardctl.slurm import make_client
from guardctl.slurm.types import JobInfo, SlurmClient
from guardctl.sources import open_source
from guardctl.storage import layout, segments
from guardctl.storage.source import Source
from guardctl.sweep.engine import SweepOptions, SweepReport, run_sweep
from guardctl.topology import Topology, split_component

# How long a network tree read from Slurm serves: it changes when the hardware does.
TOPOLOGY_TTL_S = 60.0

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
    return source.newest(analyzer)


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
    refused: str = ""  # why nothing was decided on this window (stale or future telemetry)
    ahead: dict[str, float] = field(default_factory=dict)  # nodes stamping records ahead
    held_back: str = ""  # why this pass did not act: not the leader, or the clocks disagree
    fabric: list[dict[str, Any]] = field(default_factory=list)  # fabric findings, what was done
    topology: str = ""  # where the network tree came from, or why there is none

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


def running_jobs(
    jobs: list[JobInfo], own: Collection[int] = frozenset()
) -> dict[str, list[JobInfo]]:
    """node -> the jobs running on it, guardctl's own sweep jobs (*own*) left out."""
    out: dict[str, list[JobInfo]] = {}
    for job in jobs:
        if job.state in LIVE and job.job_id not in own:
            for node in job.nodes:
                out.setdefault(node, []).append(job)
    return out


def own_sweep_jobs(
    settings: Settings, entries: Sequence[Entry], jobs: Sequence[JobInfo]
) -> frozenset[int]:
    """guardctl's own sweep jobs among *jobs*, by what a user cannot forge: Slurm gave the job
    an id that a sweep recorded in the action log (``sweep jobs``), and the job runs in one of
    guardctl's reservations (their users are the operators'). A job's name proves nothing:
    anyone may call a job ``guardctl-x``, and it would make a busy node look free."""
    recorded = {
        str(j)
        for e in entries
        if e.action == "sweep jobs"
        for j in dict(e.evidence.get("jobs") or {})
    }
    prefixes = (settings.quarantine.reservation_prefix, settings.sweep.reservation_prefix)
    return frozenset(
        j.job_id for j in jobs if str(j.job_id) in recorded and j.reservation.startswith(prefixes)
    )


def gather(
    settings: Settings,
    ops: NodeOps,
    analysis: Analysis,
    now: float,
    topology: Topology | None = None,
) -> Gathered:
    """Read Slurm and the action log beside *analysis*; build the policy's view."""
    entries = ops.log.entries()  # once: the snapshot and the ladders read the same entries
    snap = ops.snapshot(entries)
    classified = classify(analysis, settings.control, fleet_size=len(snap.nodes), topology=topology)
    jobs = ops.slurm.jobs()
    ladders = derive(entries)
    owners = {n: ops.owner(snap, n) for n in snap.nodes}
    root = settings.store.root
    dds = frozenset(f.job for f in classified.findings if f.job and _serves(root, f.job))
    requeueable = {
        j.job_id: (j.end_time - now if j.end_time else None)
        for j in jobs
        if j.requeue and j.state == "RUNNING"
    }
    duration = settings.control.sweep_duration_s or settings.sweep.gemm_duration_s
    named = {f.node for f in classified.findings} | set(ladders)
    own = own_sweep_jobs(settings, entries, jobs)
    view = policy.View(
        classified,
        owners,
        running_jobs(jobs, own),
        ladders,
        now,
        duration,
        dds,
        requeueable,
        analysis.window_end,
        unknown=frozenset(n for n in named if n not in snap.nodes),
        sweeps_held=policy.sweeps_broken(ladders, now, settings.control),
    )
    return Gathered(analysis, classified, entries, ladders, view, snap.out_for_repair)


def _serves(root: Path, job: str) -> bool:
    """Whether the data-sharding service runs for *job* (its directory in the store)."""
    try:
        return layout.dds_dir(root, job).is_dir()
    except (OSError, ValueError):
        return False


class Controller:
    """The mitigation loop over one store and one Slurm."""

    def __init__(
        self,
        settings: Settings,
        *,
        act: bool,
        slurm: SlurmClient | None = None,
        progress: Progress = lambda _m: None,
        clock: Clock | None = None,
    ) -> None:
        """*clock*: this host's clocks (a test skews or pauses them; never a setting)."""
        self.settings = settings
        self.cfg = settings.control
        self.wants_to_act = act and not settings.safety.observe_only
        self.held_back = ""  # why this pass observes only, though it would act (one line)
        self.clock = clock or Clock()
        # Fenced: every change to Slurm and every log entry checks the lease first.
        inner = slurm if slurm is not None else make_client(settings)
        self.ops = NodeOps(settings, FencedSlurm(inner, self._fenced), clock=self.clock.wall)
        self.ops.log = FencedLog(settings.store.root, self.clock.wall, self._fenced)
        self.lease = Lease(
            settings.store.root, self.cfg.lease_s, action_lock=self.ops.locked, clock=self.clock
        )
        self.source = open_source(settings, None, None, self.ops.slurm)  # its jobs: same Slurm
        self.analyzer = Analyzer(settings, clock=self.clock.wall)  # up to the newest record
        self._rechecks = segments.Rechecks()  # when the leader last looked at closed segments
        self.progress = progress
        self.polled = False  # the daemon: sweeps run across passes (see the module docstring)
        self.interval_s = self.cfg.interval_s  # between passes (the daemon's --interval)
        self.sweeps = Sweeps(self.ops, progress)
        self._tree: tuple[float, Topology | None, str] | None = None  # (read at, tree, line)

    @property
    def acting(self) -> bool:
        """Whether this pass acts: asked to, and nothing held it back (see held_back)."""
        return self.wants_to_act and not self.held_back

    @acting.setter
    def acting(self, value: bool) -> None:
        self.wants_to_act = value

    @contextmanager
    def _fenced(self) -> Iterator[None]:
        """The store's action lock, and under it the lease checked (raises LeaseLost)."""
        with self.ops.locked():
            self.lease.check()
            yield

    def as_daemon(self, interval_s: float) -> None:
        """Passes follow each other every *interval_s* from now on: sweeps run across passes,
        and with ``[control] align`` the windows end on a multiple of the interval, so that a
        window one pass judged is judged again unchanged a window length later and the
        analyzer keeps its figures. A single pass (``--once``) judges up to the newest record:
        aligning it would only hide the newest minute, as nothing is kept after it.
        An interval the lease does not outlast by far (``--interval``) is a ConfigError."""
        check_lease(self.cfg.lease_s, interval_s, "--interval")
        self.interval_s = interval_s
        self.polled = True
        # The analyzer keeps every node's column mirror open from pass to pass, within a
        # quarter of the limit: a daemon started by hand, not by the unit (LimitNOFILE),
        # would open most of them every pass.
        raise_open_files_limit(CONTROLLER_OPEN_FILES)
        if self.cfg.align:
            self.analyzer.grid_s = interval_s

    def analysis(self) -> Analysis:
        """This pass's analysis, from the configured source (raises SourceError)."""
        return newest_analysis(self.source, self.analyzer)

    def _source_seen(self) -> dict[str, Any] | None:
        cov = self.source.coverage
        return cov.to_dict() if cov is not None else None  # the store has none

    # -- the lease -------------------------------------------------------------------------
    def lead(self) -> tuple[bool, Holder | None]:
        """Take or renew the lease; not held: the sweeps of an earlier tenure are forgotten
        here, untouched (the leader's clean-up closes them)."""
        held, holder = self.lease.acquire()
        if not held:
            self.sweeps.forget()
        return held, holder

    def _renew(self, message: str) -> None:
        held, _ = self.lease.acquire()
        if not held:
            raise LeaseLost(
                f"{self.lease.why}; stopping the sweep "
                "(the node stays quarantined for the next leader)"
            )
        self.progress(message)

    def _clocks_refusal(self) -> str:
        """Why the clocks forbid acting this pass ("" when they agree; guardctl.clock)."""
        return skew_refusal(
            self.settings.store.root,
            "controller",
            socket.gethostname(),
            self.cfg.max_clock_skew_s,
            self.clock,
        )

    # -- the network tree -------------------------------------------------------------------
    def topology(self) -> tuple[Topology | None, str]:
        """The network tree (``[control] racks``, or Slurm's topology plugin), read at most
        every ``TOPOLOGY_TTL_S``, and a line saying where it came from or why there is none.
        A tree Slurm cannot give: None (the classifier falls back on ``[control] racks``
        alone), said in one line when that starts."""
        from guardctl.topology import load_topology

        at = self.clock.mono()
        if self._tree is not None and at - self._tree[0] < TOPOLOGY_TTL_S:
            return self._tree[1], self._tree[2]
        was = self._tree[2] if self._tree is not None else ""
        try:
            tree = load_topology(self.ops.slurm, self.cfg.racks)
        except SlurmError as exc:
            tree, line = (
                None,
                (
                    "cannot read the network tree from Slurm, going on with [control] racks "
                    f"alone: {' '.join(str(exc).split())}"
                ),
            )
            if not was.startswith("cannot read"):
                self.progress(f"control: {line}")
        else:
            line = (
                f"{tree.source}: {len(tree.leaves())} leaf switch(es), {len(tree.nodes())} nodes"
                if tree is not None
                else "none (no [control] racks, no topology plugin in Slurm)"
            )
        self._tree = (at, tree, line)
        return tree, line

    # -- one pass ---------------------------------------------------------------------------
    def run_pass(self, dry_run: bool = False) -> PassReport:
        """One pass (:meth:`_pass`) and, but for a dry run, this host's last-pass file: when it
        ended, how long it took, whether it led, acted or was held back, or why it failed
        (:func:`record.write_pass`; what ``guardctl export`` reports the controller's
        liveness from)."""
        if dry_run:
            return self._pass(True)
        started = time.monotonic()
        try:
            report = self._pass(False)
        except Exception as exc:  # said in the file, then raised as ever
            self._note_pass(started, None, " ".join(f"{type(exc).__name__}: {exc}".split()))
            raise
        self._note_pass(started, report, "")
        if report.leader:
            self._close_segments()
        return report

    def _close_segments(self) -> None:
        """Close the store's ended segments (:mod:`guardctl.storage.compact`), which every later
        reader reads instead of the nodes' files: the leader's chore, after the pass so that it
        never delays a decision. It changes nothing in Slurm; a failure is said in one line and
        the next pass tries again."""
        root = self.settings.store.root
        if not is_store(root):
            return  # a Prometheus-only site, or a store not mounted: the pass has said so
        from pyarrow import ArrowException  # the controller's host reads telemetry: it has it

        from guardctl.storage.compact import compact

        cfg = self.settings.analyze
        try:
            # The files as this pass's analysis listed them: a store keeps weeks of segments,
            # millions of directory entries that a second walk would list again every pass.
            # A source that is not the store leaves the analyzer idle: it lists them then,
            # again only the directories that changed since the previous pass.
            groups = self.analyzer.segment_files(list_again=self.source.kind != "store")
            # A pass's share: the lease (renewed by the next pass) must never wait on it.
            budget = min(self.interval_s, self.cfg.lease_s / 4)
            # Closed segments are not looked at file by file every pass (a store keeps weeks
            # of them): those that may still grow, less often the older they are; bytes they
            # gain meanwhile are read past them all the same.
            done = compact(
                root,
                self.clock.wall(),
                workers=cfg.parsers(),
                threads=cfg.pass_threads(),
                budget_s=budget,
                rechecks=self._rechecks,
                groups=groups,
            )
        except (OSError, ValueError, GuardctlError, ArrowException) as exc:
            self.progress(f"control: closing segments: {' '.join(str(exc).split())}")
            return
        if done.closed:
            later = f"; {done.deferred} left for the next pass" if done.deferred else ""
            self.progress(
                f"control: closed segments {', '.join(done.closed)} ({done.records} records){later}"
            )

    def _note_pass(self, started: float, report: PassReport | None, error: str) -> None:
        why = record.write_pass(
            self.settings.store.root,
            socket.gethostname(),
            {
                "ts": self.clock.wall(),
                "duration_s": time.monotonic() - started,
                "pid": os.getpid(),
                "interval_s": self.interval_s,
                "leader": bool(report and report.leader),
                "acting": bool(report and report.acting),
                "observe_only": not self.wants_to_act,
                "held_back": report.held_back if report and report.leader else "",
                "refused": report.refused if report else "",
                "error": error,
            },
        )
        if why:
            self.progress(f"control: {why}")

    def _pass(self, dry_run: bool) -> PassReport:
        """Lead, read, decide, act (or record what it would do); see the module docstring."""
        self.held_back = ""
        if not dry_run:
            held, holder = self.lead()
            if not held:
                return PassReport(
                    False, False, holder.as_dict() if holder else None, held_back=self.lease.why
                )
            self.held_back = self._clocks_refusal()
            if self.held_back and self.wants_to_act:
                self.progress(f"control: observing only this pass: {self.held_back}")
        analysis = self.analysis()  # first: a source that fails leaves the pass doing nothing
        now = self.clock.wall()
        unsure = self._window_unsure(analysis, now)  # stale or future: nothing decided
        # Reconciling changes Slurm: an observing pass leaves it to the next acting command.
        reconciled = self.ops.reconcile() if self.acting and not dry_run else []
        if self.acting and not dry_run:  # observing only: not even its own sweeps' jobs
            self._sweeps_in_flight()
        tree, tree_line = self.topology()
        g = gather(self.settings, self.ops, analysis, now, tree)
        report = PassReport(
            True,
            self.acting and not dry_run,
            reconciled=len(reconciled),
            window=(g.analysis.window_start, g.analysis.window_end),
            findings=[f.as_dict() for f in g.classified.findings],
            fleet=[f.as_dict() for f in g.classified.fleet],
            source=self._source_seen(),
            refused=unsure,
            ahead=analysis.ahead,
            held_back=self.held_back,
            fabric=[f.as_dict() for f in policy.fabric_findings(g.classified)],
            topology=tree_line,
        )
        if unsure:  # what it saw is in the report; the next pass carries on
            return report
        if not dry_run:
            record.record_pass(self.ops, g.entries, g.classified)
            record.record_fleet(self.ops, g.entries, g.classified)
            record.record_fabric(self.ops, g.entries, g.classified)
            record.record_fresh_starts(self.ops, g.ladders, g.view.owners, g.out_for_repair)
        for plan in policy.fabric_plan(g.view, self.cfg):
            outcome = self._fabric_quarantine(plan, g, dry_run)
            if not dry_run:
                record.record_fabric_quarantine(
                    self.ops, g.entries, plan.finding.component, plan.nodes, outcome
                )
            for row in report.fabric:
                if row["component"] == plan.finding.component:
                    row["quarantine"] = {**plan.as_dict(), "outcome": outcome}
        # Observe-only walks the ladder on paper: its paper quarantines are the policy's view.
        view = g.view if self.wants_to_act else rehearsal.paper_view(g.view)
        for decision in policy.decide(view, self.cfg):
            if not dry_run:  # rung a's watch is a record, observing only or not
                record.record_rebalance(self.ops, decision, g.ladders.get(decision.node))
            outcome, extra = self._carry_out(decision, g, dry_run)
            if not dry_run and not self.wants_to_act and not self.held_back:
                outcome = rehearsal.rehearse(self.ops, view, decision, g.ladders.get(decision.node))
            if not dry_run and (
                (decision.acts and self.wants_to_act)
                or record.changed(decision, g.ladders.get(decision.node), outcome)
            ):
                record.record_decision(self.ops, decision, outcome, extra)
            report.decisions.append({**decision.as_dict(), "outcome": outcome, **extra})
        return report

    def _window_unsure(self, analysis: Analysis, now: float) -> str:
        """Why nothing may be decided on *analysis* (its window stale, or after now), said in
        one line; "" when it may. Nodes whose records are stamped ahead are said too: those
        records are left out of the window, and the pass goes on."""
        ahead = ahead_line(analysis, now)
        if ahead:
            self.progress(f"control: {ahead}")
        why = out_of_date(analysis, now, self.cfg.max_clock_skew_s)
        if why:
            self.progress(
                f"control: {why}: nothing decided or done on it; the next pass carries on"
            )
        return why or ""

    def _fabric_quarantine(self, plan: policy.FabricPlan, g: Gathered, dry_run: bool) -> str:
        """Quarantine the nodes in service behind a fabric finding (all or none: the cap and
        the controller's hourly budget count each node); the outcome, in one line."""
        if dry_run or not self.acting:
            return "would do"
        used = self._actions_last_hour()
        if used + len(plan.nodes) > self.cfg.max_actions_per_hour:
            return (
                f"skipped: {used} controller action(s) in the last hour, {len(plan.nodes)} "
                f"more would pass control.max_actions_per_hour={self.cfg.max_actions_per_hour}"
            )
        f = plan.finding
        evidence = {
            "by": BY,
            "decision": "quarantine",
            "kind": "fabric",
            "fabric": f.component,
            "confidence": f.confidence,
        }
        try:
            taken = self.ops.quarantine(list(plan.nodes), f"control: {plan.why}", evidence=evidence)
        except (LeaseLost, SlurmUnavailable):
            raise  # the pass stops here; the intents let the next one reconcile
        except RefusedError as exc:
            return f"refused: {' '.join(str(exc).split())}"
        except (UsageError, SlurmError) as exc:
            return f"failed: {' '.join(str(exc).split())}"
        done = [a.node for a in taken if a.outcome == "done"]
        return f"done: {len(done)} node(s) quarantined" + (
            f", {len(taken) - len(done)} left as they were" if len(done) < len(taken) else ""
        )

    def _carry_out(
        self, d: policy.Decision, g: Gathered, dry_run: bool
    ) -> tuple[str, dict[str, Any]]:
        if not d.acts:
            return "", {}
        if dry_run or not self.acting:
            return "would do", {}
        used = self._actions_last_hour()
        if d.action != "release" and used >= self.cfg.max_actions_per_hour:
            return (
                f"skipped: {used} controller action(s) in the last hour "
                f"(control.max_actions_per_hour={self.cfg.max_actions_per_hour})"
            ), {}
        try:
            return self._act(d, g)
        except (LeaseLost, SlurmUnavailable):
            raise  # the pass stops here; the intent log lets the next one reconcile
        except RefusedError as exc:
            return f"refused: {exc}", {}
        except (UsageError, SlurmError) as exc:
            # This node's own trouble (Slurm refused its change, or does not know it): the
            # decision's outcome, and the other nodes' decisions go on.
            return f"failed: {' '.join(str(exc).split())}", {}

    def _act(self, d: policy.Decision, g: Gathered) -> tuple[str, dict[str, Any]]:
        evidence = {
            "by": BY,
            "decision": d.action,
            "rung": d.rung,
            "kind": d.kind,
            "jobs": list(d.jobs),
            **{
                k: v
                for k, v in d.evidence.items()
                if k in ("impact", "relapse", "rebalance", "fabric")
            },
        }
        if d.action == "quarantine":
            (taken,) = self.ops.quarantine([d.node], f"control: {d.why}", evidence=evidence)
            if taken.outcome != "done":  # someone quarantined it since the read: theirs
                return f"{taken.outcome}: {taken.message}; left alone", {}
            if not d.jobs:  # free at the read: on to the sweep if it still is
                return self._sweep_if_free(d, g, "done")
            return "done", {}
        if d.action == "sweep":
            return self._sweep_if_free(d, g, "")
        if d.action == "drain":
            self.ops.drain([d.node], f"control: {d.why}", evidence=evidence)
            return "done", {}
        if d.action == "requeue" and d.job is not None:
            return self._requeue(d)
        if d.action == "release":  # a fabric finding's quarantine, now that it cleared
            (freed,) = self.ops.release([d.node], evidence=evidence)
            return f"{freed.outcome}: {freed.message}" if freed.outcome != "done" else "done", {}
        return "", {}

    def _sweep_if_free(
        self, d: policy.Decision, g: Gathered, done: str
    ) -> tuple[str, dict[str, Any]]:
        """Sweep *d*'s node if a second look (Slurm and the log read anew, the same analysis)
        still decides to: a job other than guardctl's own that landed since the read, an
        operator's quarantine, or a hold makes it wait; never a sweep beside such a job."""
        fresh = gather(self.settings, self.ops, g.analysis, self.clock.wall(), self.topology()[0])
        now = policy.decide_node(fresh.view, self.cfg, d.node)
        if now.action != "sweep":
            return f"{done + '; ' if done else ''}not swept: {now.why}", {}
        avoid = frozenset(
            {f.node for f in fresh.classified.findings}
            | {n for f in policy.covering(fresh.classified) for n in f.nodes}
            | {
                n
                for n, lad in fresh.ladders.items()
                if lad.quarantined_by_control or lad.sweeping or lad.rebalance
            }
        )
        return self._sweep(
            d.node, now.duration_s, int(now.evidence.get("relapse", 0)), d.why, avoid
        )

    def _sweep(
        self,
        node: str,
        duration: float,
        relapse: int,
        why: str,
        avoid: frozenset[str] = frozenset(),
    ) -> tuple[str, dict[str, Any]]:
        """Sweep *node*, never with a node of *avoid* (the current suspects) as a partner."""
        lemon = policy.is_lemon(self.cfg, relapse)
        options = SweepOptions(
            kind=self.cfg.sweep_kind,
            duration_s=duration,
            release_passed=not lemon,
            avoid=avoid - {node},
        )
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
            except LeaseLost:
                raise  # nothing more is done, not even for the other sweeps
            except RefusedError as exc:  # aborted and closed; the node stays quarantined
                self.progress(f"control: sweep {flight.sweep_id} of {flight.node}: {exc}")
        if clean_up:
            entries = self.ops.log.entries()
            self.sweeps.clean_up(derive(entries), entries)

    def _swept(self, flight: Swept | InFlight, report: SweepReport) -> tuple[str, dict[str, Any]]:
        """Record a judged sweep; a lemon that passed is drained all the same; an undetermined
        one (kept quarantined, retried later) may show the sweeps themselves broken."""
        node, relapse, lemon, why = flight.node, flight.relapse, flight.lemon, flight.why
        verdict = report.verdicts[0]
        self.ops.record(
            "control sweep",
            [node],
            reason=verdict.evidence,
            evidence={
                "verdict": verdict.verdict,
                "action": verdict.action,
                "sweep": report.sweep_id,
                "duration_s": flight.duration_s,
                "relapse": relapse,
                "lemon": lemon,
                "background": self.polled,
            },
        )
        record_sweep_fabric(self.ops, report)  # a switch at fault: noted, no node drained
        if verdict.verdict == "undetermined":
            self._note_broken_sweeps()
        if lemon and verdict.verdict == "pass":
            # Relapsing after every passed sweep: the burn-in cannot see its fault, the jobs can.
            self.ops.drain(
                [node],
                f"control: lemon after relapse {relapse}, its sweep passed ({verdict.evidence})",
                evidence={
                    "by": BY,
                    "decision": "drain",
                    "rung": "e",
                    "relapse": relapse,
                    "sweep": report.sweep_id,
                    "why": why,
                },
            )
            return "swept: pass, drained as a lemon", {"sweep": report.sweep_id}
        return f"swept: {verdict.verdict}, {verdict.action}", {"sweep": report.sweep_id}

    def _note_broken_sweeps(self) -> None:
        """Record once per ``undetermined_window_s`` that sweeps measure nothing on too many
        nodes (a fleet-wide finding: the harness, not the nodes; no node is swept meanwhile)."""
        entries = self.ops.log.entries()
        now = self.ops.clock()
        why = policy.sweeps_broken(derive(entries), now, self.cfg)
        since = now - self.cfg.undetermined_window_s
        if not why or any(
            e.action == "control fleet" and e.evidence.get("scope") == "sweeps" and e.ts >= since
            for e in entries
        ):
            return
        nodes = sorted(
            {
                n
                for e in entries
                if e.action == "control sweep"
                and e.ts >= since
                and e.evidence.get("verdict") == "undetermined"
                for n in e.nodes
            }
        )
        self.progress(f"control: {why}")
        self.ops.record(
            "control fleet",
            nodes,
            reason=why,
            evidence={"scope": "sweeps", "name": "sweeps", "nodes": nodes, "why": why},
        )

    def _requeue(self, d: policy.Decision) -> tuple[str, dict[str, Any]]:
        """Requeue the decision's job off its node through the door (an intent, then an
        outcome; a job it left held is released by the next pass's reconcile)."""
        assert d.job is not None
        self.ops.requeue(
            d.job,
            d.node,
            d.why,
            signal=self.cfg.signal,
            grace_s=self.cfg.signal_grace_s,
            evidence={"by": BY, "decision": d.action, "rung": d.rung, **d.evidence},
        )
        return "done", {}

    def _actions_last_hour(self) -> int:
        # The log as it is now (this pass's own actions count): the reader reads only what was
        # appended since its last read.
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
        """Poll the daemon's sweeps in flight (the leader, between passes; not while the
        clocks hold it back)."""
        if self.acting and (self.sweeps.running or self.sweeps.leftover):
            self._sweeps_in_flight(clean_up=False)  # the log is read at the next pass

    # -- explain ----------------------------------------------------------------------------
    def explain(self, node: str) -> dict[str, Any]:
        """Why the controller chooses what it chooses for *node*, from a read-only round.

        A node Slurm does not know is a usage error, unless the telemetry or the log names it:
        then the answer says it is unknown to Slurm and left alone."""
        snap = self.ops.snapshot()
        g = gather(self.settings, self.ops, self.analysis(), self.clock.wall(), self.topology()[0])
        if node not in g.view.unknown:
            snap.known([node])
        decision = next((d for d in policy.decide(g.view, self.cfg) if d.node == node), None)
        finding = g.classified.of(node)
        verdict = g.analysis.verdict_of(node)
        return {
            "node": node,
            "verdict": verdict.to_dict() if verdict else None,
            "finding": finding.as_dict() if finding else None,
            "impact": describe(node, finding.impact if finding else None),
            "decision": decision.as_dict() if decision else None,
            "owner": (
                ["unknown to Slurm", ""]
                if node in g.view.unknown
                else list(g.view.owners.get(node, ("in service", "")))
            ),
            "jobs": [j.job_id for j in g.view.running.get(node, ())],
            "ladder": g.ladders.get(node, NodeLadder(node)).as_dict(),
            "fleet": [f.as_dict() for f in g.classified.fleet if node in f.nodes],
            "fabric": [
                f.as_dict() for f in policy.fabric_findings(g.classified) if node in f.nodes
            ],
            "history": [
                e.as_dict() for e in g.entries if node in e.nodes and e.action.startswith("control")
            ][-10:],
        }

    def explain_component(self, name: str) -> dict[str, Any]:
        """What the controller makes of a fabric component (``leaf:s1``) from a read-only
        round: the finding now with its evidence, the nodes behind it and the decision for
        each, and the component's records in the log. A malformed name is a usage error."""
        try:
            kind, switch = split_component(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        tree, tree_line = self.topology()
        g = gather(self.settings, self.ops, self.analysis(), self.clock.wall(), tree)
        finding = next(
            (f for f in policy.fabric_findings(g.classified) if f.component == name), None
        )
        records = [
            e for e in g.entries if e.action == FABRIC and e.evidence.get("component") == name
        ]
        opened = open_fabric(g.entries).get(name)
        nodes = finding.nodes if finding else tuple(opened.nodes if opened else ())
        if not nodes and tree is not None:
            nodes = _behind(tree, kind, switch)
        decisions = {d.node: d for d in policy.decide(g.view, self.cfg)}
        return {
            "component": name,
            "kind": kind,
            "finding": finding.as_dict() if finding else None,
            "state": "open" if finding else ("open in the log" if opened else "not at fault"),
            "topology": tree_line,
            "fabric_quarantine": self.cfg.fabric_quarantine,
            "nodes": [
                {
                    "node": n,
                    "owner": list(g.view.owners.get(n, ("unknown to Slurm", ""))),
                    "fabric_quarantine": g.ladders.get(n, NodeLadder(n)).fabric == name,
                    "decision": decisions[n].as_dict() if n in decisions else None,
                }
                for n in nodes
            ],
            "history": [e.as_dict() for e in records][-10:],
        }


def _behind(tree: Topology, kind: str, switch: str) -> tuple[str, ...]:
    """The nodes whose traffic goes through a component of *tree*."""
    if kind == "link":
        return (switch,) if tree.leaf_of(switch) is not None else ()
    if kind == "leaf":
        return tree.switches[switch].nodes if switch in tree.switches else ()
    return tree.nodes_under(switch)


def holder_line(report: PassReport) -> str:
    """The line a controller that is not the leader prints (why, by its own clock: another
    host's wall clock says nothing here)."""
    if report.held_back:
        return report.held_back
    h = report.holder or {}
    return (
        f"another controller leads (pid {h.get('pid')} on {h.get('host')}): observing, not acting"
    )


def serve(
    controller: Controller,
    interval_s: float,
    emit: Callable[[PassReport], None],
    warn: Callable[[str], None],
) -> None:
    """Run passes every *interval_s* until interrupted, renewing the lease in between.

    Slurm down, the store unwritable or not mounted (its marker missing) or the telemetry source
    failing for a pass: one line, and the next pass carries on (a pass whose source failed
    decided and did nothing).
    The lease is given up on the way out, so another controller need not wait for it to expire.
    """
    from guardctl.errors import GuardctlError, StoreError
    from guardctl.storage import store

    controller.as_daemon(interval_s)
    try:
        while True:
            leader = False
            # The store's mount gone: its mount point is a local directory, where a lease and an
            # action log would be guardctl's alone. No pass, and no lease, until it is back.
            unmounted = store.unmarked(controller.settings.store.root)
            try:
                if unmounted:
                    raise StoreError(unmounted)
                report = controller.run_pass()
                leader = report.leader
                emit(report)
            except LeaseLost as exc:  # mid-pass: nothing more done; its sweeps left as they are
                controller.sweeps.forget()
                warn(str(exc))
            except SourceError as exc:
                warn(
                    "no analysis this pass, nothing decided or done; the next one carries on: "
                    f"{' '.join(str(exc).split())}"
                )
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
            if controller.lease.holds():
                controller.sweeps.abort_all("the controller stopped")
            else:  # not ours to touch any more: the leader's clean-up closes them
                controller.sweeps.forget()
        finally:
            controller.lease.release()


def _between(controller: Controller, warn: Callable[[str], None]) -> None:
    """Between passes, the leader polls its sweeps: a batch's end starts the next one."""
    from guardctl.errors import GuardctlError

    try:
        controller.tick()
    except LeaseLost as exc:
        controller.sweeps.forget()
        warn(str(exc))
    except GuardctlError as exc:
        warn(f"sweep poll failed, the next pass carries on: {' '.join(str(exc).split())}")


def counts_toward_cap(e: Entry) -> bool:
    """Whether a log entry is one of the controller's own actions that
    ``control.max_actions_per_hour`` counts: a node action it took, a requeue, a sweep."""
    node_action = e.phase == "done" and e.action in NODE_ACTIONS and e.evidence.get("by") == BY
    # a release only gives a node back
    node_action = node_action and e.action != "release"
    # a requeue counts when tried: it restarts the job whether or not its release went through
    requeued = e.action == REQUEUE and e.phase == "intent"
    # a daemon's sweep counts when it starts, one pass's when it is judged
    swept = e.action == SWEEPING or (
        e.action == "control sweep" and not e.evidence.get("background")
    )
    return node_action or requeued or swept
