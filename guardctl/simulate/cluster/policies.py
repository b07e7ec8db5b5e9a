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
* ``guardctl``: health checks plus guardctl's own controller, driven through its library:
  the analysis its stage-aware analyzer would give (from its measured delay, recall and
  false-suspect bound) classified by :func:`guardctl.controller.classify.classify`, decided
  by :func:`guardctl.controller.policy.decide` (with the real ski-rental rule) on the real
  ladder and owners read from Slurm and the run's action log, and acted on through
  :class:`guardctl.nodeops.NodeOps` over the in-memory Slurm on its clock; the data-sharding
  service gives a node found at fault less work.
* ``guardctl-fabric``: the same controller told the cluster's tree: ``classify`` is given the
  topology (fabric localisation: a switch's fault names the switch and takes no node), and its
  pairwise sweeps choose partners by the tree. ``guardctl`` is today's node-only controller
  (no topology), run on the same faults.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guardctl.actionlog import ActionLog, Entry
from guardctl.analyze.engine import HEALTHY, SUSPECT, UNKNOWN, Analysis, Evidence, NodeVerdict
from guardctl.config import Settings
from guardctl.controller import policy as control
from guardctl.controller.classify import Classified, classify
from guardctl.controller.ladder import BY, NodeLadder, derive
from guardctl.controller.loop import counts_toward_cap
from guardctl.controller.record import faults, record_fabric, record_fresh_starts
from guardctl.errors import RefusedError
from guardctl.nodeops import Action, NodeOps
from guardctl.nodeops.ownership import REQUEUE, Owner
from guardctl.sections.control import ControlSettings
from guardctl.sections.safety import SafetySettings
from guardctl.sections.store import StoreSettings
from guardctl.simulate.cluster.engine import Cluster, Flag, Policy
from guardctl.slurm.types import JobInfo

NAMES = ("none", "failstop", "guard", "guardctl")
FABRIC = "guardctl-fabric"
CHOICES = (*NAMES, FABRIC)


class NoMitigation:
    """Nothing but Slurm's own handling of a crashed node."""

    name, health_checks, rebalances, topology_sweeps = "none", False, False, False

    def on_pass(self, sim: Cluster) -> None:
        pass

    def on_sweep(self, sim: Cluster, node: str, verdict: str) -> None:
        sim.release(node)

    def start(self, sim: Cluster) -> None:
        pass

    def stop(self) -> None:
        pass


class FailStop(NoMitigation):
    """Fail-stop health checks (NHC, a prolog): lost GPUs are drained, slow nodes unseen."""

    name, health_checks = "failstop", True


class GuardStyle(FailStop):
    """Detect, quarantine, sweep when free, drain on a failed sweep (see the module)."""

    name = "guard"

    def on_pass(self, sim: Cluster) -> None:
        for flag in sim.flagged(stage_aware=False):
            if flag.suspect:
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
    """guardctl's controller: its classification, decisions, records and node-action door.

    Each pass builds the analysis guardctl's analyzer would give (every node in a job, the
    flagged ones with their detectors' evidence), classifies it with :func:`classify`, reads
    who holds each node and each node's ladder from Slurm and the action log as the real pass
    does, and acts on :func:`~guardctl.controller.policy.decide`'s decisions through
    :class:`NodeOps` (ownership, caps, rate limit, intent logged first) over the in-memory
    Slurm, on its clock, with a store of its own for the run. Sweeps are modelled (the engine
    says pass or fail); their verdicts are recorded and acted on as the real loop does.
    """

    name, rebalances = "guardctl", True

    def __init__(
        self,
        cfg: ControlSettings,
        safety: SafetySettings | None = None,
        store: Path | None = None,
        topology: bool = False,
    ) -> None:
        """*store*: where the run keeps its store (its action log); None: a temporary
        directory, removed after the run. *topology*: the controller is told the cluster's
        tree (``guardctl-fabric``); without it, today's node-only controller."""
        self.topology = self.topology_sweeps = topology
        if topology:
            self.name = FABRIC
        self.cfg = cfg
        self.safety = safety or SafetySettings()
        self.store = store
        self.lemons: dict[str, bool] = {}  # node -> whether its running sweep is a lemon's last
        self._ops: NodeOps | None = None
        self._store: tempfile.TemporaryDirectory[str] | None = None
        self._log: TailedLog | None = None
        self._healthy: dict[tuple[str, int, bool], NodeVerdict] = {}

    # -- the run's store and door --------------------------------------------------------------
    def start(self, sim: Cluster) -> None:
        root = self.store
        if root is None:
            self._store = tempfile.TemporaryDirectory(prefix="guardctl-simulate-")
            root = Path(self._store.name)
        settings = Settings(store=StoreSettings(root=root), safety=self.safety, control=self.cfg)
        self._ops = NodeOps(settings, sim.slurm, clock=sim.slurm.time)
        self._ops.log = self._log = TailedLog(settings.store.root, sim.slurm.time)

    def stop(self) -> None:
        if self._store is not None:
            self._store.cleanup()
            self._store = None

    @property
    def ops(self) -> NodeOps:
        if self._ops is None:
            raise RuntimeError("the guardctl policy acts only inside Cluster.run()")
        return self._ops

    @property
    def log(self) -> TailedLog:
        if self._log is None:
            raise RuntimeError("the guardctl policy acts only inside Cluster.run()")
        return self._log

    def ladders(self) -> dict[str, NodeLadder]:
        return derive(self.log.entries())

    # -- one pass ----------------------------------------------------------------------------
    def on_pass(self, sim: Cluster) -> None:
        flags = sim.flagged(stage_aware=True)
        if self.topology:
            classified = classify(self.analysis(sim, flags), self.cfg, topology=sim.topology)
            sim.named(classified.fabric)
        else:
            classified = classify(self.analysis(sim, flags), self.cfg)
        at_fault = faults(classified)
        for node in at_fault:
            job = sim.jobs[sim.node_job[node]]
            if job.large:
                sim.rebalance(job, node)  # the data-sharding service, on its own
        # As the real pass: Slurm and the log read once (the ladders before this pass's
        # records), then the records, then the decisions on what was read.
        entries = self.log.entries()
        ladders = derive(entries)
        snap = self.ops.snapshot()
        asked = {f.node for f in classified.findings} | sim.quarantined | set(ladders)
        owners = {n: self.ops.owner(snap, n) for n in sorted(asked)}  # the nodes it asks of
        last = next((e for e in reversed(entries) if e.action == "control pass"), None)
        if (sorted(last.nodes) if last else []) != at_fault:
            # record.record_pass's note, without the findings' evidence (read by no decision)
            self.ops.record("control pass", at_fault, reason=f"{len(at_fault)} node(s) at fault")
        if self.topology:
            record_fabric(self.ops, entries, classified)  # as the loop: its component, opened
        record_fresh_starts(self.ops, ladders, owners, snap.out_for_repair)
        view = self.view(sim, classified, owners, ladders)
        for decision in control.decide(view, self.cfg):
            if decision.acts:
                self.act(sim, decision)

    def analysis(self, sim: Cluster, flags: list[Flag]) -> Analysis:
        """What guardctl's analyzer would say now: a verdict for every node in a job (unknown
        while its job starts up: no step measured yet, and none of its traffic to judge)."""
        window = sim.p.pass_s
        flagged = {f.node: self.verdict(sim, f, window) for f in flags}
        verdicts = [
            flagged.get(n) or self.unflagged(n, job, sim.now >= sim.jobs[job].ready)
            for n, job in sim.node_job.items()
        ]
        return Analysis(sim.now - window, sim.now, tuple(verdicts))

    def unflagged(self, node: str, job: int, running: bool) -> NodeVerdict:
        key = (node, job, running)
        if key not in self._healthy:
            if len(self._healthy) > 100_000:
                self._healthy.clear()
            verdict = HEALTHY if running else UNKNOWN
            self._healthy[key] = NodeVerdict(node, verdict, 0.0, job=str(job))
        return self._healthy[key]

    @staticmethod
    def verdict(sim: Cluster, flag: Flag, window: float) -> NodeVerdict:
        """A flagged node's verdict: suspect once flagged for the detection delay, each of its
        detectors' evidence, and what it costs its job (the ski-rental rule reads that)."""
        job = sim.jobs[flag.job]
        factor = sim.factor.get(flag.node, 1.0)
        without = sim.without(job, flag.node)
        impact = {
            "job": str(flag.job),
            "pct": round(100.0 * max(0.0, job.factor - without) / job.factor, 3),
            "gpus": job.gpus,
        }
        evidence = tuple(
            Evidence(
                d,
                "step time",
                "x",
                factor,
                1.0,
                factor - 1.0,
                factor - 1.0,
                sim.now - window,
                sim.now,
            )
            for d in flag.detectors
        )
        windows = 1 + int((sim.now - flag.since) // window)
        return NodeVerdict(
            flag.node,
            SUSPECT if flag.suspect else HEALTHY,
            factor - 1.0,
            evidence=evidence,
            flagged_windows=windows,
            job=str(flag.job),
            impact=impact,
        )

    def view(
        self,
        sim: Cluster,
        classified: Classified,
        owners: dict[str, tuple[Owner, str]],
        ladders: dict[str, NodeLadder],
    ) -> control.View:
        nodes = {f.node for f in classified.findings} | sim.quarantined
        running: dict[str, list[JobInfo]] = {}
        requeueable: dict[int, float | None] = {}
        for node in nodes:
            job_id = sim.node_job.get(node)
            if job_id is None:
                continue
            job = sim.jobs[job_id]
            running[node] = [
                JobInfo(
                    job_id,
                    "train" if job.large else "batch",
                    "root",
                    "RUNNING",
                    tuple(job.nodes),
                    requeue=True,
                )
            ]
            requeueable[job_id] = None if job.large else (job.eta() - sim.now)
        dds = frozenset(
            f.job for f in classified.findings if f.job is not None and sim.jobs[int(f.job)].large
        )
        return control.View(
            classified, owners, running, ladders, sim.now, sim.p.sweep_s, dds, requeueable
        )

    # -- acting, through the door ---------------------------------------------------------------
    def act(self, sim: Cluster, d: control.Decision) -> None:
        if self.actions_last_hour(sim.now) >= self.cfg.max_actions_per_hour:
            sim.tally.skipped += 1  # as the real loop: past control.max_actions_per_hour
            return
        evidence = {
            "by": BY,
            "decision": d.action,
            "rung": d.rung,
            "kind": d.kind,
            "jobs": list(d.jobs),
        }
        if d.action == "quarantine":
            if self.door(sim, self.ops.quarantine, d.node, f"control: {d.why}", evidence=evidence):
                sim.held(d.node)
                if not d.jobs:  # free already: straight on to the sweep, as the loop
                    ladder = self.ladders().get(d.node, NodeLadder(d.node))
                    fresh = control.View(Classified(()), {}, {}, {}, sim.now, sim.p.sweep_s)
                    self.sweep(sim, d.node, *control.sweep_duration(fresh, self.cfg, ladder))
        elif d.action == "sweep":
            self.sweep(sim, d.node, d.duration_s, int(d.evidence.get("relapse", 0)))
        elif d.action == "drain":
            self.drain(sim, d.node, f"control: {d.why}", evidence)
        elif d.action == "requeue" and d.job is not None and sim.jobs[d.job].running:
            # logged as the door logs it (intent, then outcome): the cap counts its intent
            requeued = {**evidence, "job": d.job, "exclude": [d.node]}
            intent = self.ops.log.record(
                REQUEUE, "intent", [d.node], reason=d.why, evidence=requeued
            )
            sim.requeue(sim.jobs[d.job], (d.node,))  # not twice when two of its nodes ask
            self.ops.log.record(
                REQUEUE, "done", [d.node], reason=d.why, evidence=requeued, entry_id=intent.id
            )

    def actions_last_hour(self, now: float) -> int:
        """The controller's own actions in the hour before *now*, counted from the action log
        by the loop's own rule (``counts_toward_cap``)."""
        count = 0
        for e in reversed(self.log.entries()):  # newest first: stop at the hour's start
            if e.ts < now - 3600:
                break
            count += counts_toward_cap(e)
        return count

    def door(
        self,
        sim: Cluster,
        action: Callable[..., list[Action]],
        node: str,
        *args: Any,
        evidence: dict[str, Any],
    ) -> bool:
        """One node action through NodeOps; whether it was done (a refusal is counted)."""
        sim.sync_clock()
        try:
            done = action([node], *args, evidence=evidence)
        except RefusedError:
            sim.tally.refused += 1
            return False
        return any(a.outcome == "done" for a in done)

    def drain(self, sim: Cluster, node: str, why: str, evidence: dict[str, Any]) -> bool:
        if not self.door(sim, self.ops.drain, node, why, evidence=evidence):
            return False
        sim.released(node)  # the door ended the quarantine with the drain
        sim.taken_out(node, "guardctl")
        return True

    def sweep(self, sim: Cluster, node: str, duration: float, relapse: int) -> None:
        if node not in sim.sweeping:
            self.lemons[node] = control.is_lemon(self.cfg, relapse)
        sim.sweep(node, duration)

    def on_sweep(self, sim: Cluster, node: str, verdict: str) -> None:
        """As the loop: the sweep releases a passed node (not a lemon's: it stays quarantined)
        and drains a failed one, its verdict is recorded, and a lemon that passed is drained.
        A topology-aware sweep's verdict "fabric" (the node's switch at fault, not the node)
        releases it as a pass does, and is no pass of the node's."""
        lemon = self.lemons.pop(node, False)
        swept = {"sweep": f"{node}@{sim.now - sim.t0:.0f}"}  # as run_sweep's, not "by" control
        if verdict == "fail":
            self.drain(sim, node, "swept: fail", swept)
        elif not lemon and self.door(sim, self.ops.release, node, evidence=swept):
            sim.released(node)
        self.ops.record("control sweep", [node], evidence={"verdict": verdict, "lemon": lemon})
        if (
            lemon
            and verdict == "pass"
            and self.drain(sim, node, "control: lemon, its sweep passed", {"by": BY, "rung": "e"})
        ):
            sim.tally.lemon_drains += 1


class TailedLog(ActionLog):
    """The run's action log, each line parsed once: a read takes only what was appended since.

    The same file, written the same way (each line under a lock, with an fsync); only reading
    differs. ``ActionLog.entries`` parses the whole file, and the door reads it three times per
    action (its reconcile, its snapshot, its rate limit): a week's log of a 2000-node fleet,
    read so at every action and pass, costs minutes where this costs seconds.
    """

    def __init__(self, root: Path, clock: Callable[[], float]) -> None:
        super().__init__(root, clock)
        self.offset, self.parsed = 0, list[Entry]()

    def entries(self) -> list[Entry]:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits
            self.offset += len(whole)
            for line in whole.decode("utf-8", errors="replace").splitlines():
                entry = Entry.from_json(line) if line.strip() else None
                if entry is not None:
                    self.parsed.append(entry)
        return list(self.parsed)


def make(
    name: str, cfg: ControlSettings | None = None, safety: SafetySettings | None = None
) -> Policy:
    """The policy called *name* (one of :data:`CHOICES`)."""
    if name in ("guardctl", FABRIC):
        return Guardctl(cfg or ControlSettings(requeue=True), safety, topology=name == FABRIC)
    plain: dict[str, type[NoMitigation]] = {
        "none": NoMitigation,
        "failstop": FailStop,
        "guard": GuardStyle,
    }
    return plain[name]()
