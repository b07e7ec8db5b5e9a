"""The discrete-event engine: one cluster, one policy, one seed, over days of simulated time.

Events wait in a heap; between two events every job runs at a constant speed
(:mod:`.jobs`), so a week of a 16k-GPU cluster is tens of thousands of events, not billions
of steps. Slurm is the in-memory Slurm (:class:`guardctl.slurm.memory.MemorySlurm`): jobs are
submitted to it, it places them (a training partition for the large jobs, a batch partition
for the small ones). The baselines, NHC and the operator act on it straight (reservations,
drains, requeues); guardctl acts through its node-action door (:class:`guardctl.nodeops.
NodeOps`) over the same Slurm, on its clock, and reports back what the door did. The policy
(:mod:`.policies`) is called every controller pass and when a sweep ends. The nodes hang from
a tree of switches (:mod:`.fabric`); a switch's fault slows every node beneath it, and none of
them has a fault of its own.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from guardctl.analyze.fabric import FabricFinding
from guardctl.simulate.cluster import fabric, faults
from guardctl.simulate.cluster.jobs import SimJob, node_factor
from guardctl.simulate.cluster.metrics import Tally
from guardctl.simulate.cluster.params import DAY, HOUR, Params
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest

Progress = Callable[[str], None]
QUARANTINE = "guardctl_q_"  # the reservation prefix of a quarantine (as [quarantine])
REQUEUE_DELAY_S = 10.0  # Slurm holds a requeued job back a moment before it may start


class Policy(Protocol):
    """What the engine asks of a mitigation policy."""

    name: str
    health_checks: bool  # NHC / prolog drains nodes whose GPU is lost
    rebalances: bool  # the data-sharding service gives a flagged node less work
    topology_sweeps: bool  # its pairwise sweeps pick partners by the tree: a switch's fault
    # fails the switch, not the node swept

    def on_pass(self, sim: Cluster) -> None: ...

    def on_sweep(self, sim: Cluster, node: str, verdict: str) -> None: ...

    def start(self, sim: Cluster) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Flag:
    """A node the analyzer (as modelled) flags at this pass, with the evidence it would give."""

    node: str
    job: int
    since: float  # when the node began slowing this job
    cause: str  # what the simulation knows it is: grey, lemon_on, failslow, contention, stage,
    # false (a false suspect: the node is healthy)
    detectors: tuple[str, ...]  # the analyzer's detectors that flag it
    suspect: bool  # flagged long enough (the measured detection delay) to be called a suspect


class Cluster:
    """The simulated cluster: Slurm, the nodes' faults, the jobs, and the tally."""

    def __init__(
        self,
        p: Params,
        policy: Policy,
        progress: Progress | None = None,
        extra: Sequence[faults.Onset] = (),
    ) -> None:
        """*extra*: faults beside the drawn ones (a scenario: a test's one degraded leaf)."""
        self.p, self.policy, self.progress = p, policy, progress
        self.names = [f"node{i:05d}" for i in range(1, p.nodes + 1)]
        self.topology = fabric.tree(self.names, p.leaf_nodes, p.spine_leaves)
        train = round(p.train_share * p.nodes)
        self.slurm = MemorySlurm([], min_job_age_s=60.0, requeue_delay_s=REQUEUE_DELAY_S)
        # The batch partition first: Slurm places a job on the lowest free nodes it may use,
        # so a small job finds its nodes without passing over the training partition's spares.
        batch = p.nodes - train
        for i, name in enumerate(self.names):
            self.slurm.add_node(name, partition="batch" if i < batch else "train")
        self.t0 = self.now = self.slurm.now
        self.end = self.t0 + p.horizon_s
        self.heap: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.sources: dict[str, dict[int, faults.Onset]] = {}  # the transient slowdowns
        # Switch faults: each one's component, onset and the nodes beneath; per node, those
        # that slow it (a node's repair leaves them: the switch is still at fault).
        self.switch_faults: dict[int, tuple[str, faults.Onset, tuple[str, ...]]] = {}
        self.beneath: dict[str, dict[int, faults.Onset]] = {}
        self.localised: set[tuple[str, float]] = set()  # (component, onset) named already
        self.cable_since: dict[str, float] = {}
        self.factor: dict[str, float] = {}
        self.slow_since: dict[str, float] = {}
        self.grey: dict[str, float] = {}
        self.phantom: dict[str, float] = {}  # node -> when the analyzer last called it falsely
        self.lemon: set[str] = set()
        self.gpu_lost: dict[str, float] = {}
        self.reveal: dict[str, float] = {}
        self.node_job: dict[str, int] = {}
        self.jobs: dict[int, SimJob] = {}
        self.pending: set[int] = set()
        self.queue: deque[tuple[SimJob, int]] = deque()  # small jobs not yet shown to Slurm
        self._without: dict[tuple[int, int, str], float] = {}
        self.quarantined: set[str] = set()
        self.sweeping: set[str] = set()
        self.drained: dict[str, str] = {}  # node -> who drained it (guardctl, nhc, operator)
        self.down: set[str] = set()
        self.repaired: set[str] = set()
        self.tally = Tally()
        self._jobs_and_faults(train)
        for o in extra:
            self.push(self.t0 + o.at, "onset", o)

    # -- setting up -------------------------------------------------------------------------
    def _jobs_and_faults(self, train: int) -> None:
        p = self.p
        sched = faults.draw(p, np.random.default_rng([p.seed, 1]))
        for o in sched.onsets:
            self.push(self.t0 + o.at, "onset", o)
        self.reveal = {self.names[n]: s for n, s in sched.reveal_s.items()}
        rng = np.random.default_rng([p.seed, 2])
        size = max(1, min(p.large_nodes, train // 4))  # a small cluster: four to a partition
        for _ in range(max(1, int(train * p.large_fill) // size)):
            imbalance = p.imbalance_slow if rng.random() < p.imbalance_share else 1.0
            self.submit(SimJob(0, True, size * p.gpus_per_node, math.inf, imbalance), size)
            self.sync()
            job_id = max(self.jobs)
            for t in faults.poisson_times(rng, p.stall_per_job_hour / HOUR, p.horizon_s):
                self.push(self.t0 + t, "stall", (job_id, float(rng.exponential(p.stall_mean_s))))
        batch = p.nodes - train
        mean_nodes = (1 + min(p.small_nodes_max, max(1, batch))) / 2
        rate = p.small_load * batch / (mean_nodes * p.small_hours * HOUR) if batch else 0.0
        for t in faults.poisson_times(rng, rate, p.horizon_s):
            nodes = int(rng.integers(1, min(p.small_nodes_max, batch) + 1))
            work = float(rng.exponential(p.small_hours * HOUR))
            self.push(self.t0 + t, "arrive", (nodes, work))
        t = self.t0 + p.pass_s
        while t < self.end:
            self.push(t, "pass", None)
            t += p.pass_s

    def push(self, at: float, kind: str, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, data))

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> Tally:
        day = 1
        self.policy.start(self)
        try:
            while self.heap and self.heap[0][0] < self.end:
                at, _, kind, data = heapq.heappop(self.heap)
                self.now = at
                getattr(self, f"_on_{kind}")(data)
                if self.progress and at - self.t0 >= day * DAY:
                    self.progress(f"{self.policy.name}: day {day} of {self.p.days:g}")
                    day += 1
        finally:
            self.policy.stop()
        self.now = self.end
        for job in self.jobs.values():
            job.advance(self.end)
        self.tally.close(self)
        return self.tally

    def sync_clock(self) -> None:
        """Bring the Slurm clock to now (Slurm may start pending jobs), then follow it."""
        if self.now > self.slurm.now:
            self.slurm.advance(self.now - self.slurm.now)
        self.sync()

    def sync(self) -> None:
        """Start, in the simulation, the pending jobs Slurm started; feed it the batch queue.

        Slurm sees one waiting small job at a time (the others wait in the simulation's own
        queue, first come, first served): the in-memory Slurm tries every pending job at every
        scheduling pass, and a long queue of jobs that cannot start would cost the run its
        speed without changing which job starts next.
        """
        while True:
            for job_id in sorted(self.pending):
                info = self.slurm.job(job_id)
                if info is not None and info.state == "RUNNING":
                    self.pending.discard(job_id)
                    self._started(self.jobs[job_id], info.nodes)
            if not self.queue or any(not self.jobs[j].large for j in self.pending):
                return
            job, nodes = self.queue.popleft()
            self.submit(job, nodes)

    # -- jobs ---------------------------------------------------------------------------------
    def submit(self, job: SimJob, nodes: int) -> None:
        partition = "train" if job.large else "batch"
        job.job_id = self.slurm.submit(
            SubmitRequest(
                "train.sbatch" if job.large else "batch.sbatch",
                job_name="train" if job.large else "batch",
                node_count=nodes,
                partition=partition,
            )
        )
        self.jobs[job.job_id] = job
        self.pending.add(job.job_id)

    def _started(self, job: SimJob, nodes: tuple[str, ...]) -> None:
        job.running, job.nodes, job.run_start, job.last = True, nodes, self.now, self.now
        job.ready = self.now + (self.p.restart_s if job.restarts or job.large else 0.0)
        job.ckpt_s, job.stalls = job.done_s, 0
        stage = max(1, math.ceil(len(nodes) / self.p.pipeline_stages))
        job.stage_nodes = frozenset(nodes[-stage:]) if job.imbalance > 1.0 else frozenset()
        for n in nodes:
            self.node_job[n] = job.job_id
            if n in self.gpu_lost:
                self.push(self.now + self.p.hang_s, "hang", (job.job_id, job.restarts))
        self.refresh(job)
        self.push(job.ready + self.p.checkpoint_s, "ckpt", (job.job_id, job.restarts))

    def refresh(self, job: SimJob) -> None:
        """Its speed changed: integrate up to now, recompute the factor, reschedule its end."""
        job.advance(self.now)
        job.node_factor = self.without(job, "")
        job.factor = job.node_factor * job.imbalance * (self.p.stall_slow if job.stalls else 1.0)
        job.version += 1
        eta = job.eta()
        if math.isfinite(eta):
            self.push(eta, "finish", (job.job_id, job.version))

    def stopped(self, job: SimJob) -> None:
        """Slurm ended or requeued the job's run: free its nodes, lose since the checkpoint."""
        job.advance(self.now)
        job.lose()
        job.restarts += 1
        for n in job.nodes:
            if self.node_job.get(n) == job.job_id:
                del self.node_job[n]
        info = self.slurm.job(job.job_id)
        if info is not None and info.state == "PENDING":
            self.pending.add(job.job_id)

    def _on_arrive(self, data: tuple[int, float]) -> None:
        self.queue.append((SimJob(0, False, data[0] * self.p.gpus_per_node, data[1]), data[0]))
        self.sync_clock()

    def _on_finish(self, data: tuple[int, int]) -> None:
        job = self.jobs[data[0]]
        if not job.running or job.version != data[1]:
            return
        self.sync_clock()
        job.advance(self.now)
        job.done_s = job.work_s
        job.running = False
        for n in job.nodes:
            self.node_job.pop(n, None)
        self.slurm.finish(job.job_id)
        self.tally.completed += 1
        self.sync()

    def _on_ckpt(self, data: tuple[int, int]) -> None:
        job = self.jobs[data[0]]
        if job.running and job.restarts == data[1]:
            job.advance(self.now)
            job.checkpoint()
            self.push(self.now + self.p.checkpoint_s, "ckpt", data)

    def _on_stall(self, data: tuple[int, float]) -> None:
        job = self.jobs[data[0]]
        if job.running and self.now >= job.ready:
            job.stalls += 1
            self.refresh(job)
            self.push(self.now + data[1], "unstall", (job.job_id, job.restarts))

    def _on_unstall(self, data: tuple[int, int]) -> None:
        job = self.jobs[data[0]]
        if job.running and job.restarts == data[1] and job.stalls:
            job.stalls -= 1
            self.refresh(job)

    def _on_hang(self, data: tuple[int, int]) -> None:
        """A job on a lost GPU: the NCCL watchdog ends it; Slurm requeues it."""
        job = self.jobs[data[0]]
        if job.running and job.restarts == data[1] and any(n in self.gpu_lost for n in job.nodes):
            self.requeue(job, ())
            self.tally.hangs += 1

    # -- node faults ----------------------------------------------------------------------------
    def _on_onset(self, o: faults.Onset) -> None:
        if o.kind in fabric.SWITCH_FAULTS:
            self._switch_fault(o)
            return
        node = self.names[o.node]
        if node in self.down or (
            o.kind == "lemon_on" and (node in self.repaired or node in self.drained)
        ):
            return  # a repaired lemon is fixed for good
        if o.kind == "crash":
            self._crash(node)
        elif o.kind == "gpu_lost":
            self.gpu_lost[node] = self.now
            self.set_factor(node)
            job = self.node_job.get(node)
            if job is not None:
                self.push(self.now + self.p.hang_s, "hang", (job, self.jobs[job].restarts))
        elif o.kind == "grey":
            self.grey[node] = o.factor
            self.set_factor(node)
        elif o.kind == "false_positive":
            self.phantom[node] = self.now
        elif o.kind == fabric.CABLE:  # until its node is repaired
            self.sources.setdefault(node, {})[self.seq] = o
            self.cable_since.setdefault(node, self.now)
            self.set_factor(node)
        else:
            if o.kind == "lemon_on":
                self.lemon.add(node)
            self.sources.setdefault(node, {})[self.seq] = o
            self.push(self.now + o.duration_s, "source_end", (node, self.seq))
            self.set_factor(node)

    def _switch_fault(self, o: faults.Onset) -> None:
        """A switch's fault slows every node beneath it (the leaf's, or the spine group's)."""
        nodes = self.topology.nodes_under(fabric.switch_of(o.kind, o.switch))
        sid = self.seq
        self.switch_faults[sid] = (fabric.component_of(o.kind, o.switch), o, nodes)
        for node in nodes:
            self.beneath.setdefault(node, {})[sid] = o
            self.set_factor(node)
        self.push(self.now + o.duration_s, "switch_end", sid)

    def _on_switch_end(self, sid: int) -> None:
        _, _, nodes = self.switch_faults.pop(sid)
        for node in nodes:
            hits = self.beneath.get(node, {})
            hits.pop(sid, None)
            if not hits:
                self.beneath.pop(node, None)
            self.set_factor(node)

    def _on_source_end(self, data: tuple[str, int]) -> None:
        node, sid = data
        if self.sources.get(node, {}).pop(sid, None) is not None:
            self.set_factor(node)

    def _crash(self, node: str) -> None:
        self.sync_clock()
        job = self.node_job.get(node)
        self.slurm.set_down(node, "Not responding")
        self.down.add(node)
        if job is not None:
            self.stopped(self.jobs[job])
        self.sync()
        self.push(self.now + self.p.repair_s, "repair", node)

    def _on_repair(self, node: str) -> None:
        if node in self.node_job:  # still running out its job: look again in an hour
            self.push(self.now + HOUR, "repair", node)
            return
        self.sync_clock()
        for table in (self.grey, self.gpu_lost, self.sources, self.cable_since):
            table.pop(node, None)
        self.lemon.discard(node)
        self.repaired.add(node)
        out = self.drained.pop(node, None) is not None or node in self.down
        self.down.discard(node)
        if out:
            self.slurm.resume([node])
        self.set_factor(node)
        self.sync()

    def set_factor(self, node: str) -> None:
        """The node's slowdown from its faults; its job follows."""
        slowdowns = [*self.sources.get(node, {}).values(), *self.beneath.get(node, {}).values()]
        f = (
            math.inf
            if node in self.gpu_lost
            else max([self.grey.get(node, 1.0), *(s.factor for s in slowdowns)])
        )
        old = self.factor.get(node, 1.0)
        if f == old:
            return
        if f == 1.0:
            self.factor.pop(node, None)
            self.slow_since.pop(node, None)
        else:
            self.factor[node] = f
            if old < self.p.detect_min_slow <= f:
                self.slow_since[node] = self.now
        job = self.node_job.get(node)
        if job is not None:
            self.refresh(self.jobs[job])

    # -- what policies see and do -------------------------------------------------------------
    def at_fault(self, node: str) -> bool:
        """Whether the node has a fault (the truth a false drain is measured against)."""
        srcs = self.sources.get(node, {}).values()
        return (
            node in self.grey
            or node in self.gpu_lost
            or node in self.lemon
            or any(s.kind in ("failslow", fabric.CABLE) for s in srcs)
        )

    def under_switch_fault(self, node: str) -> bool:
        """Whether a switch's fault slows the node (which may have a fault of its own too)."""
        return node in self.beneath

    def flagged(self, stage_aware: bool) -> list[Flag]:
        """The nodes the analyzer flags now, from its measured delay, recall and false suspects.

        A slow node shows from the first pass that sees it and is a suspect once the measured
        detection delay has passed. guardctl's analyzer compares a rank with the ranks of its
        own pipeline stage (*stage_aware*); a detector without stages (the Guard-style baseline)
        also flags the slowest stage's nodes. A false suspect is a healthy node in a job that
        the analyzer calls a suspect at one pass (``false_positive_per_node_pass``), for both.
        """
        p, out = self.p, []
        candidates = {
            n: "" for n, f in self.factor.items() if p.detect_min_slow <= f and math.isfinite(f)
        }
        if not stage_aware:
            for job in self.jobs.values():
                if job.running and job.imbalance >= p.detect_min_slow:
                    candidates.update({n: "stage" for n in job.stage_nodes if n not in candidates})
        for node, cause in sorted(candidates.items()):
            job_id = self.node_job.get(node)
            if job_id is None:
                continue
            job = self.jobs[job_id]
            since = job.ready if cause else max(job.ready, self.slow_since.get(node, job.ready))
            if self.now < since or not self.detected(node, since):
                continue
            detectors: tuple[str, ...] = ("busy_time",)
            if not cause:
                cause, detectors = self.cause(node)
            out.append(
                Flag(node, job_id, since, cause, detectors, self.now - since >= p.detect_delay_s)
            )
        for node, at in sorted(self.phantom.items()):
            job_id = self.node_job.get(node)
            if self.now - at < p.pass_s and node not in candidates and job_id is not None:
                out.append(Flag(node, job_id, at, "false", ("busy_time",), True))
        return out

    def cause(self, node: str) -> tuple[str, tuple[str, ...]]:
        """What slows *node* (its worst cause first), and every detector its slowdowns trip."""
        srcs = [*self.sources.get(node, {}).values(), *self.beneath.get(node, {}).values()]
        # A grey node shows busy time alone; the fabric's faults show no busy time of theirs.
        own = {"busy_time"} if node in self.grey or not srcs else set()
        detectors = tuple(sorted({d for s in srcs for d in s.detectors} | own))
        if node in self.grey:
            return "grey", detectors
        return max((s.kind for s in srcs), key=lambda k: k != "contention"), detectors

    def detected(self, node: str, since: float) -> bool:
        """The analyzer's recall, drawn once per episode (the same draw for every policy)."""
        if self.p.recall >= 1.0:
            return True
        key = zlib.crc32(f"{self.p.seed}:{node}:{since:.0f}".encode())
        return (key % 100_000) / 100_000 < self.p.recall

    def without(self, job: SimJob, node: str) -> float:
        """How much its nodes slow the job were *node* at its peers' pace (its impact)."""
        key = (job.job_id, job.version, node)
        if key in self._without:
            return self._without[key]
        if len(self._without) > 100_000:
            self._without.clear()
        plain = [
            self.factor.get(n, 1.0) for n in job.nodes if n != node and n not in job.rebalanced
        ]
        moved = [n for n in job.nodes if n != node and n in job.rebalanced]
        value = node_factor(plain, [self.own_factor(n) for n in moved])
        # Less work hides a slow GPU, not a slow switch or cable: the collective waits for the
        # network whatever share of the data a rank is given.
        value = max([value, *(self.fabric_factor(n) for n in moved)])
        self._without[key] = value
        return value

    def fabric_factor(self, node: str) -> float:
        """The node's slowdown from the fabric: its switches' faults and its cable."""
        return max(
            [
                1.0,
                *(s.factor for s in self.beneath.get(node, {}).values()),
                *(s.factor for s in self.sources.get(node, {}).values() if s.kind == fabric.CABLE),
            ]
        )

    def own_factor(self, node: str) -> float:
        """The node's slowdown less the fabric's (its whole factor when the fabric is well)."""
        if node in self.gpu_lost:
            return math.inf
        own = [s.factor for s in self.sources.get(node, {}).values() if s.kind != fabric.CABLE]
        return max([self.grey.get(node, 1.0), *own])

    # Straight to Slurm: the baselines' own quarantines, NHC's and the operator's drains.
    def quarantine(self, node: str) -> None:
        self.sync_clock()
        if node not in self.quarantined:
            self.slurm.create_reservation(QUARANTINE + node, [node], ["root"])
            self.held(node)

    def release(self, node: str) -> None:
        self.sync_clock()
        if node in self.quarantined:
            self.slurm.delete_reservation(QUARANTINE + node)
        self.released(node)

    def drain(self, node: str, by: str) -> None:
        """Drain for repair. A policy's drain (*by* ``"guardctl"``) ends its own quarantine
        first; NHC and an operator leave a reservation that holds the node as it is."""
        self.sync_clock()
        if node in self.drained:
            return
        if by == "guardctl":
            self.release(node)
        self.slurm.drain([node], f"{by}: held out for repair")
        self.taken_out(node, by)

    # What each did, in the simulation's own books (guardctl's door reports here as well).
    def held(self, node: str) -> None:
        self.quarantined.add(node)
        self.tally.quarantines += 1
        self.tally.false_quarantines += 0 if self.at_fault(node) else 1

    def released(self, node: str) -> None:
        self.quarantined.discard(node)
        self.sync()

    def taken_out(self, node: str, by: str) -> None:
        """Drained for repair; a policy's drain of a healthy node is a false drain."""
        if by == "guardctl":
            self.tally.drains += 1
            self.tally.false_drains += 0 if self.at_fault(node) else 1
        self.drained[node] = by
        self.push(self.now + self.p.repair_s, "repair", node)
        self.mitigated(node)

    def requeue(self, job: SimJob, exclude: tuple[str, ...]) -> None:
        """Requeue the job (its nodes in *exclude* left out of its next run)."""
        self.sync_clock()
        self.slurm.requeue(job.job_id)
        if exclude:
            self.slurm.update_job(
                job.job_id, exclude=sorted(self.slurm.excluded(job.job_id) | set(exclude))
            )
        self.tally.requeues += 1 if exclude else 0
        for n in exclude:
            self.mitigated(n)
        self.stopped(job)
        self.push(self.now + REQUEUE_DELAY_S, "wake", None)

    def rebalance(self, job: SimJob, node: str) -> None:
        if node not in job.rebalanced:
            job.rebalanced.add(node)
            self.mitigated(node)
            self.refresh(job)

    def mitigated(self, node: str) -> None:
        """The node stops costing its job: note how long its fault cost it."""
        since = self.slow_since.get(node)
        if since is not None and self.at_fault(node) and node in self.node_job:
            self.tally.mitigation_s.append(self.now - since)

    def sweep(self, node: str, duration_s: float) -> None:
        if (
            node in self.sweeping
            or node in self.node_job
            or node in self.drained
            or (node in self.down)
        ):
            return
        self.sweeping.add(node)
        self.tally.sweeps += 1
        self.tally.false_sweeps += 0 if self.at_fault(node) else 1
        self.push(self.now + duration_s, "sweep_done", (node, duration_s))

    def _on_sweep_done(self, data: tuple[str, float]) -> None:
        node, duration = data
        self.sync_clock()
        self.sweeping.discard(node)
        revealed = node in self.grey and duration >= self.reveal.get(node, 0.0)
        slow = any(
            s.kind in ("failslow", "lemon_on", fabric.CABLE)
            for s in self.sources.get(node, {}).values()
        )
        # A switch's fault fails the pairwise all-reduce of every node beneath it when the
        # partner is chosen without the tree; partners chosen by it put the blame on the switch
        # (the node's verdict "fabric": released, never drained).
        own = revealed or slow or node in self.gpu_lost
        switch = self.under_switch_fault(node)
        if own or (switch and not self.policy.topology_sweeps):
            verdict = "fail"
        else:
            verdict = "fabric" if switch else "pass"
        self.policy.on_sweep(self, node, verdict)

    # -- passes ---------------------------------------------------------------------------------
    def _on_wake(self, _: None) -> None:
        self.sync_clock()

    def _on_pass(self, _: None) -> None:
        self.sync_clock()
        if self.policy.health_checks:
            self.health_checks()
        else:
            self.operator_notice()
        self.policy.on_pass(self)
        out = self.down | set(self.drained) | self.quarantined
        self.tally.out_of_service.append(len(out))
        held = self.quarantined | {n for n, by in self.drained.items() if by == "guardctl"}
        healthy = sum(1 for n in held if not self.at_fault(n))
        self.tally.healthy_held_gpu_h += healthy * self.p.gpus_per_node * self.p.pass_s / HOUR

    # -- fabric findings ------------------------------------------------------------------------
    def named(self, findings: Iterable[FabricFinding]) -> None:
        """A policy's fabric findings of this pass, against what is at fault: the time from a
        fault's onset to the pass that first names its component, and the names wrong."""
        for f in findings:
            kind, _, node = f.component.partition(":")
            onsets = [self.t0 + o.at for c, o, _ in self.switch_faults.values() if c == f.component]
            if kind == "link" and node in self.cable_since:
                onsets.append(self.cable_since[node])
            if onsets:
                self.tally.named.add(f.component)
            for onset in onsets:
                if (f.component, onset) not in self.localised:
                    self.localised.add((f.component, onset))
                    self.tally.localise_s.append(self.now - onset)
            # A node's own communication fail-slow may well be its link: not a wrong name.
            comm = kind == "link" and any(
                s.kind == "failslow" and "xmit_wait" in s.detectors
                for s in self.sources.get(node, {}).values()
            )
            if not onsets and not comm:
                self.tally.misnamed.add(f.component)

    def health_checks(self) -> None:
        """NHC and the prolog: a node whose GPU is lost is drained (its job ends on a hang)."""
        for node in sorted(self.gpu_lost):
            if node not in self.drained:
                self.drain(node, "nhc")

    def operator_notice(self) -> None:
        """Without health checks, an operator drains a node that has failed jobs for hours."""
        for node, since in sorted(self.gpu_lost.items()):
            if node not in self.drained and self.now - since >= self.p.notice_s:
                self.drain(node, "operator")
