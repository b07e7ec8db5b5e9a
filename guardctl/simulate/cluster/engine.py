"""The discrete-event engine: one cluster, one policy, one seed, over days of simulated time.

Events wait in a heap; between two events every job runs at a constant speed
(:mod:`.jobs`), so a week of a 16k-GPU cluster is tens of thousands of events, not billions
of steps. Slurm is the in-memory Slurm (:class:`guardctl.slurm.memory.MemorySlurm`): jobs are
submitted to it, it places them (a training partition for the large jobs, a batch partition
for the small ones). The baselines, NHC and the operator act on it straight (reservations,
drains, requeues); guardctl acts through its node-action door (:class:`guardctl.nodeops.
NodeOps`) over the same Slurm, on its clock, and reports back what the door did. The policy
(:mod:`.policies`) is called every controller pass and when a sweep ends.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from guardctl.simulate.cluster import faults
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

    def __init__(self, p: Params, policy: Policy, progress: Progress | None = None) -> None:
        self.p, self.policy, self.progress = p, policy, progress
        self.names = [f"node{i:05d}" for i in range(1, p.nodes + 1)]
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
        else:
            if o.kind == "lemon_on":
                self.lemon.add(node)
            self.sources.setdefault(node, {})[self.seq] = o
            self.push(self.now + o.duration_s, "source_end", (node, self.seq))
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
        for table in (self.grey, self.gpu_lost, self.sources):
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
        f = (
            math.inf
            if node in self.gpu_lost
            else max(
                [self.grey.get(node, 1.0), *(s.factor for s in self.sources.get(node, {}).values())]
            )
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
            or any(s.kind == "failslow" for s in srcs)
        )

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
        srcs = list(self.sources.get(node, {}).values())
        detectors = tuple(sorted({d for s in srcs for d in s.detectors} | {"busy_time"}))
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
        moved = [self.factor.get(n, 1.0) for n in job.nodes if n != node and n in job.rebalanced]
        self._without[key] = value = node_factor(plain, moved)
        return value

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
        self.push(self.now + duration_s, "sweep_done", (node, duration_s))

    def _on_sweep_done(self, data: tuple[str, float]) -> None:
        node, duration = data
        self.sync_clock()
        self.sweeping.discard(node)
        revealed = node in self.grey and duration >= self.reveal.get(node, 0.0)
        slow = any(s.kind in ("failslow", "lemon_on") for s in self.sources.get(node, {}).values())
        verdict = "fail" if revealed or slow or node in self.gpu_lost else "pass"
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
