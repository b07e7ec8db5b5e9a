"""An in-memory Slurm: the whole :class:`~guardctl.slurm.types.SlurmClient` protocol over dicts.

For fast unit tests of the node-action rules and for fleet simulations of the mitigation
controller; the tests against a real local Slurm (the lab) stay the proof that guardctl works
with Slurm itself. It starts no process, opens no socket and reads no file, so it cannot reach
a real cluster. Everything is deterministic: job ids count from 1, time is a number that moves
only through :meth:`MemorySlurm.advance` (or :meth:`~MemorySlurm.sleep`), and the scheduler
places jobs first come, first served, on the lowest free nodes.

What it models, the way Slurm 22.05 behaves (docs/foundation.md, "Tested releases, and what
differs"):

* nodes: idle / allocated / down, the DRAIN flag (a draining node keeps its job), reasons with
  who set them and when; RESUME of a node that is neither drained nor down is an error, and so
  is a DRAIN without a reason; MAINTENANCE and RESERVED flags while a reservation holds a node;
* reservations: start now, last until deleted; without IGNORE_JOBS they cannot cover a node
  that runs a job, without MAINT (or OVERLAP) they cannot overlap another reservation; only jobs
  that name a reservation (and whose user it lists) run on its nodes, and no other job does; a
  reservation with a running job cannot be deleted;
* jobs: one job per node (whole nodes, as sweep and training jobs ask); states PENDING,
  RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL; ``--nodelist`` (every node at
  once), ``--nodes=N``, ``--reservation``, ``--partition``, ``--time``, ExcNodeList; requeue
  (not of a pending job, nor of one submitted with ``--no-requeue``), requeue held and release;
  a node that goes down ends its job as NODE_FAIL and requeues it when it may be; finished jobs
  stay listed for ``min_job_age_s`` (MinJobAge) and are then forgotten.

A job runs until :meth:`MemorySlurm.finish` ends it, its time limit passes, or the *runtime*
callable given to the constructor said how long it takes. Signals are recorded on the job
(:meth:`MemorySlurm.signals`); KILL ends it as CANCELLED, as ``scancel`` does, and what a program
does on any other signal is for the caller to model with :meth:`~MemorySlurm.finish`.

Every lookup is a dict or set operation and free nodes wait in a heap by position, so placing a
job costs O(its nodes x log fleet) (plus the free nodes it may not use, such as reserved ones):
fleets of thousands of nodes run at the speed of Python dicts (``bench/memory_slurm.py``).
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from guardctl.errors import SlurmError
from guardctl.nodes import validate_name
from guardctl.slurm.job import signal_name
from guardctl.slurm.types import JobInfo, NodeInfo, ReservationInfo, SubmitRequest
from guardctl.topology import Topology

Runtime = Callable[[JobInfo], float | None]  # seconds a started job runs; None: until finished
EPOCH = 1_800_000_000.0  # where a MemorySlurm's clock starts (a fixed, plausible Unix time)
_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_OVERLAPPING = frozenset({"MAINT", "OVERLAP"})


@dataclass
class _Node:
    name: str
    partitions: tuple[str, ...]
    cpus: int
    gres: str
    down: bool = False
    drain: bool = False
    reason: str = ""
    reason_user: str = ""
    reason_time: float | None = None
    job: int | None = None  # the job running on it


@dataclass
class _Reservation:
    name: str
    nodes: tuple[str, ...]
    users: tuple[str, ...]
    flags: frozenset[str]
    start_time: float


@dataclass
class _Job:
    job_id: int
    request: SubmitRequest
    user: str
    submit_time: float
    requeue_allowed: bool
    state: str = "PENDING"
    nodes: tuple[str, ...] = ()
    reason: str = "None"
    held: bool = False
    begin: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    excluded: frozenset[str] = frozenset()
    runs: int = 0  # how often it started: an end event of an older run is ignored
    restarts: int = 0
    signals: list[str] = field(default_factory=list)

    @property
    def wanted(self) -> int:
        return len(self.request.nodes) or self.request.node_count or 1


class MemorySlurm:
    """A whole Slurm cluster in memory, deterministic, driven by :meth:`advance`."""

    def __init__(
        self,
        nodes: Iterable[str],
        *,
        partition: str = "main",
        cpus: int = 8,
        gres: str = "",
        user: str = "root",
        min_job_age_s: float = 300.0,
        requeue_delay_s: float = 0.0,
        runtime: Runtime | None = None,
        start: float = EPOCH,
    ) -> None:
        self.now = float(start)
        self.user = user
        self.min_job_age_s = min_job_age_s
        self.requeue_delay_s = requeue_delay_s  # Slurm holds a requeued job back a moment too
        self.runtime = runtime
        self._nodes: dict[str, _Node] = {}
        self._pos: dict[str, int] = {}  # the order nodes were added in: scheduling order
        self._free: set[str] = set()  # up, not drained, no job
        # The free nodes by position, lowest first, for placing jobs without sorting the fleet:
        # entries of nodes that are no longer free are dropped when they come up.
        self._heap: list[tuple[int, str]] = []
        self._in_heap: set[str] = set()
        self._resv: dict[str, _Reservation] = {}
        self._node_resv: dict[str, set[str]] = {}
        self._jobs: dict[int, _Job] = {}
        self._pending: dict[int, None] = {}  # insertion-ordered: first come, first served
        # (time, is a time limit, sequence, job, run, kind): the next end of a running job
        self._events: list[tuple[float, bool, int, int, int, str]] = []
        self._finished: deque[tuple[float, int]] = deque()  # (end time, job): purge order
        self._seq = 0
        self._next_job = 1
        # What `scontrol show topology` would print: None (no topology plugin) until a test
        # or simulation sets a tree.
        self.tree: Topology | None = None
        self.partitions = {partition}
        self.default_partition = partition
        for name in nodes:
            self.add_node(name, partition=partition, cpus=cpus, gres=gres)

    # -- the clock -------------------------------------------------------------------------
    def time(self) -> float:
        """This cluster's clock (Unix seconds); pass it where guardctl takes a clock."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """A sleep that moves this cluster's clock instead of the caller's."""
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Let *seconds* pass: jobs end, time limits fire, the queue is scheduled."""
        if seconds < 0:
            raise ValueError("advance: time does not go back")
        target = self.now + seconds
        self._schedule()
        while self._events and self._events[0][0] <= target:
            when, _, _, job_id, run, kind = heapq.heappop(self._events)
            self.now = max(self.now, when)
            job = self._jobs.get(job_id)
            if job is not None and job.state == "RUNNING" and job.runs == run:
                self._end(
                    job, "COMPLETED" if kind == "done" else "TIMEOUT", 0 if kind == "done" else 1
                )
            self._schedule()
        self.now = target
        self._purge()
        self._schedule()

    # -- building the cluster --------------------------------------------------------------
    def add_node(
        self, name: str, *, partition: str = "main", cpus: int = 8, gres: str = ""
    ) -> None:
        validate_name(name)
        if name in self._nodes:
            raise ValueError(f"node {name} exists")
        self._pos[name] = len(self._pos)
        self._nodes[name] = _Node(name, (partition,), cpus, gres)
        self.partitions.add(partition)
        self._set_free(name)

    def set_down(self, name: str, reason: str = "Not responding") -> None:
        """The node stops answering (slurmd died, the machine hung): its job fails."""
        node = self._node(name)
        node.down, node.reason, node.reason_user, node.reason_time = (
            True,
            reason,
            "slurm",
            self.now,
        )
        self._free.discard(name)
        if node.job is not None:
            job = self._jobs[node.job]
            self._end(job, "NODE_FAIL", 1)
            if job.requeue_allowed:
                self._requeue(job, hold=False)
        self._schedule()

    # -- reads -----------------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        return [self._node_info(n) for n in self._nodes.values()]

    def jobs(self) -> list[JobInfo]:
        self._purge()
        return [self._job_info(j) for j in self._jobs.values()]

    def recent_jobs(self) -> list[JobInfo]:
        # jobs() already lists the ended jobs until MinJobAge forgets them, as 22.05's
        # `squeue --json` does.
        return self.jobs()

    def reservations(self) -> list[ReservationInfo]:
        return [
            ReservationInfo(r.name, r.nodes, r.users, r.flags, r.start_time, None, "ACTIVE")
            for r in self._resv.values()
        ]

    def topology(self) -> Topology | None:
        return self.tree

    def job(self, job_id: int) -> JobInfo | None:
        self._purge()
        job = self._jobs.get(int(job_id))
        return self._job_info(job) if job is not None else None

    def signals(self, job_id: int) -> list[str]:
        """The signals sent to a job, in order (what the job's program would have seen)."""
        return list(self._get_job(job_id).signals)

    def restarts(self, job_id: int) -> int:
        """How often the job was requeued (Slurm's restart_cnt)."""
        return self._get_job(job_id).restarts

    def excluded(self, job_id: int) -> frozenset[str]:
        """The job's ExcNodeList."""
        return self._get_job(job_id).excluded

    # -- node actions ----------------------------------------------------------------------
    def drain(self, nodes: Sequence[str], reason: str) -> None:
        if not reason.strip():
            raise SlurmError("scontrol failed: a drain needs a reason")
        for node in [self._node(n) for n in nodes]:
            node.drain, node.reason, node.reason_user, node.reason_time = (
                True,
                reason,
                self.user,
                self.now,
            )
            self._free.discard(node.name)

    def resume(self, nodes: Sequence[str]) -> None:
        chosen = [self._node(n) for n in nodes]
        for node in chosen:
            if not (node.drain or node.down):
                raise SlurmError(f"scontrol failed: Invalid node state specified ({node.name})")
        for node in chosen:
            node.drain = node.down = False
            node.reason, node.reason_user, node.reason_time = "", "", None
            if node.job is None:
                self._set_free(node.name)
        self._schedule()

    def create_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        users: Sequence[str],
        flags: Sequence[str] = ("MAINT", "IGNORE_JOBS"),
    ) -> None:
        flagset = frozenset(_word(f).upper() for f in flags)
        if name in self._resv:
            raise SlurmError(
                "scontrol failed: Error creating the reservation: Duplicate reservation name"
            )
        _word(name)
        if not users:
            raise SlurmError(
                "scontrol failed: Error creating the reservation: "
                "Users or Accounts must be specified"
            )
        chosen = tuple(dict.fromkeys(self._node(n).name for n in nodes))
        if not chosen:
            raise SlurmError("scontrol failed: Error creating the reservation: no nodes")
        busy = [
            n
            for n in chosen
            if ("IGNORE_JOBS" not in flagset and self._nodes[n].job is not None)
            or (
                not flagset & _OVERLAPPING
                and any(not self._resv[o].flags & _OVERLAPPING for o in self._node_resv.get(n, ()))
            )
        ]
        if busy:
            raise SlurmError(
                "scontrol failed: Error creating the reservation: "
                f"Requested nodes are busy ({','.join(busy)})"
            )
        self._resv[name] = _Reservation(
            name, chosen, tuple(_word(u) for u in users), flagset, self.now
        )
        for n in chosen:
            self._node_resv.setdefault(n, set()).add(name)

    def delete_reservation(self, name: str) -> None:
        resv = self._resv.get(name)
        if resv is None:
            raise SlurmError(
                "scontrol failed: Error deleting the reservation: "
                "Invalid reservation name specified"
            )
        if any(
            self._nodes[n].job is not None
            and self._jobs[self._nodes[n].job or 0].request.reservation == name
            for n in resv.nodes
        ):
            raise SlurmError("scontrol failed: Error deleting the reservation: Reservation is busy")
        del self._resv[name]
        for n in resv.nodes:
            self._node_resv[n].discard(name)
        self._schedule()

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, request: SubmitRequest) -> int:
        for n in request.nodes:
            self._node(
                n, fail="sbatch failed: Batch job submission failed: Invalid node name specified"
            )
        if request.reservation:
            resv = self._resv.get(request.reservation)
            if resv is None or self.user not in resv.users:
                raise SlurmError(
                    "sbatch failed: Batch job submission failed: Requested reservation is invalid"
                )
            if not set(request.nodes) <= set(resv.nodes):
                raise SlurmError(
                    "sbatch failed: Batch job submission failed: "
                    "Requested node configuration is not available"
                )
        if request.partition and request.partition not in self.partitions:
            raise SlurmError(
                "sbatch failed: Batch job submission failed: Invalid partition name specified"
            )
        job = _Job(
            self._next_job,
            request,
            self.user,
            self.now,
            requeue_allowed="--no-requeue" not in request.extra,
            begin=self.now,
        )
        self._next_job += 1
        self._jobs[job.job_id] = job
        self._pending[job.job_id] = None
        self._schedule()
        return job.job_id

    def finish(self, job_id: int, exit_code: int = 0) -> None:
        """The job's program ends with *exit_code* (COMPLETED when 0, FAILED otherwise)."""
        job = self._get_job(job_id)
        if job.state != "RUNNING":
            raise SlurmError(f"job {job_id} is {job.state}, not running")
        self._end(job, "COMPLETED" if exit_code == 0 else "FAILED", exit_code)
        self._schedule()

    def cancel(self, job_id: int) -> None:
        job = self._get_job(job_id)
        if job.state not in ("PENDING", "RUNNING"):
            raise SlurmError(
                f"scancel failed: Kill job error on job id {job_id}: "
                "Job/step already completing or completed"
            )
        self._end(job, "CANCELLED", 0)
        self._schedule()

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        job = self._get_job(job_id)
        if job.state == "PENDING":
            raise SlurmError(f"scontrol failed: {job_id}: Job is pending execution")
        if not job.requeue_allowed:
            raise SlurmError(
                f"scontrol failed: {job_id}: Requested operation is presently disabled"
            )
        if job.state == "RUNNING":
            self._end(job, "REQUEUED", 0)
        self._requeue(job, hold=hold)
        self._schedule()

    def release_hold(self, job_id: int) -> None:
        job = self._get_job(job_id)
        if job.held:
            job.held, job.reason = False, "None"
            self._schedule()

    def update_job(self, job_id: int, *, exclude: Sequence[str]) -> None:
        job = self._get_job(job_id)
        if job.state != "PENDING":
            raise SlurmError(f"scontrol failed: {job_id}: Job is no longer pending execution")
        job.excluded = frozenset(self._node(n).name for n in exclude)
        self._schedule()

    def signal(self, job_id: int, signal: str) -> None:
        job = self._get_job(job_id)
        name = signal_name(signal)
        if job.state != "RUNNING":
            raise SlurmError(
                f"scancel failed: Kill job error on job id {job_id}: "
                "Job/step already completing or completed"
            )
        job.signals.append(name)
        if name == "KILL":
            self._end(job, "CANCELLED", 0)
            self._schedule()

    # -- inside ----------------------------------------------------------------------------
    def _node(self, name: str, fail: str = "") -> _Node:
        node = self._nodes.get(name)
        if node is None:
            raise SlurmError(fail or f"scontrol failed: Invalid node name specified ({name})")
        return node

    def _get_job(self, job_id: int) -> _Job:
        self._purge()
        job = self._jobs.get(int(job_id))
        if job is None:
            raise SlurmError(f"Invalid job id specified ({job_id})")
        return job

    def _node_info(self, node: _Node) -> NodeInfo:
        flags = set()
        if node.drain:
            flags.add("DRAIN")
        held_by = self._node_resv.get(node.name)
        if held_by:
            flags.add("RESERVED")
            if any("MAINT" in self._resv[r].flags for r in held_by):
                flags.add("MAINTENANCE")
        state = "down" if node.down else "allocated" if node.job is not None else "idle"
        return NodeInfo(
            node.name,
            state,
            frozenset(flags),
            node.reason,
            node.reason_user,
            node.reason_time,
            node.partitions,
            node.cpus,
            node.gres,
        )

    def _job_info(self, job: _Job) -> JobInfo:
        r = job.request
        return JobInfo(
            job.job_id,
            r.job_name,
            job.user,
            job.state,
            job.nodes,
            r.reservation,
            r.partition or self.default_partition,
            job.exit_code,
            job.reason if job.state == "PENDING" else "None",
            job.submit_time,
            job.start_time,
            job.end_time,
            requeue=job.requeue_allowed,
            excluded=tuple(sorted(job.excluded)),
        )

    def _end(self, job: _Job, state: str, exit_code: int) -> None:
        for n in job.nodes:
            node = self._nodes[n]
            node.job = None
            if not (node.drain or node.down):
                self._set_free(n)
        self._pending.pop(job.job_id, None)
        job.state, job.exit_code, job.end_time = state, exit_code, self.now
        if state != "REQUEUED":
            self._finished.append((self.now, job.job_id))

    def _requeue(self, job: _Job, *, hold: bool) -> None:
        job.state, job.nodes, job.held, job.restarts = "PENDING", (), hold, job.restarts + 1
        job.reason = "JobHeldAdmin" if hold else "None"  # what squeue shows at once
        job.begin, job.exit_code = self.now + self.requeue_delay_s, None
        job.start_time = job.end_time = None
        self._pending[job.job_id] = None

    def _purge(self) -> None:
        while self._finished and self._finished[0][0] + self.min_job_age_s <= self.now:
            _, job_id = self._finished.popleft()
            job = self._jobs.get(job_id)
            if (
                job is not None
                and job.end_time is not None
                and job.state not in ("PENDING", "RUNNING")
                and job.end_time + self.min_job_age_s <= self.now
            ):
                del self._jobs[job_id]

    def _set_free(self, name: str) -> None:
        self._free.add(name)
        if name not in self._in_heap:
            self._in_heap.add(name)
            heapq.heappush(self._heap, (self._pos[name], name))

    def _schedule(self) -> None:
        """Start every pending job that can start now, first come, first served."""
        if not self._pending or not self._free:
            return
        for job_id in list(self._pending):
            if not self._free:
                break
            job = self._jobs[job_id]
            chosen = self._place(job)
            if chosen:
                self._start(job, chosen)

    def _lowest_free(self, job: _Job) -> tuple[str, ...]:
        """The lowest free nodes *job* may use, as many as it wants, or () if too few."""
        picked: list[tuple[int, str]] = []
        skipped: list[tuple[int, str]] = []
        while self._heap and len(picked) < job.wanted:
            entry = heapq.heappop(self._heap)
            self._in_heap.discard(entry[1])
            if entry[1] not in self._free:
                continue  # it got a job or was drained since: dropped until it is free again
            (picked if self._eligible(job, entry[1]) else skipped).append(entry)
        back = skipped if len(picked) == job.wanted else skipped + picked
        for entry in back:
            self._in_heap.add(entry[1])
            heapq.heappush(self._heap, entry)
        return tuple(n for _, n in picked) if len(picked) == job.wanted else ()

    def _place(self, job: _Job) -> tuple[str, ...]:
        if job.held or job.begin > self.now:
            job.reason = "JobHeldAdmin" if job.held else "BeginTime"
            return ()
        resv = job.request.reservation
        if resv and resv not in self._resv:
            job.reason = "ReservationDeleted"
            return ()
        if job.request.nodes:
            wanted = job.request.nodes
            ok = all(n in self._free and self._eligible(job, n) for n in wanted)
            job.reason = "None" if ok else "ReqNodeNotAvail"
            return tuple(wanted) if ok else ()
        picked = self._lowest_free(job)
        if not picked:
            job.reason = "Resources"
        return picked

    def _eligible(self, job: _Job, name: str) -> bool:
        if name in job.excluded:
            return False
        part = job.request.partition
        if part and part not in self._nodes[name].partitions:
            return False
        held_by = self._node_resv.get(name)
        if job.request.reservation:
            return bool(held_by) and job.request.reservation in (held_by or ())
        return not held_by

    def _start(self, job: _Job, nodes: tuple[str, ...]) -> None:
        for n in nodes:
            self._nodes[n].job = job.job_id
            self._free.discard(n)
        del self._pending[job.job_id]
        job.state, job.nodes, job.start_time, job.reason = "RUNNING", nodes, self.now, "None"
        job.runs += 1
        limit = job.request.time_limit_min
        if limit:
            self._event(self.now + limit * 60.0, job, "timeout")
        if self.runtime is not None:
            seconds = self.runtime(self._job_info(job))
            if seconds is not None:
                self._event(self.now + max(0.0, seconds), job, "done")

    def _event(self, when: float, job: _Job, kind: str) -> None:
        self._seq += 1
        # "done" sorts before "timeout" at the same instant: a job that ends as its limit
        # passes completed.
        heapq.heappush(self._events, (when, kind != "done", self._seq, job.job_id, job.runs, kind))


def _word(text: str) -> str:
    if not _WORD.match(text):
        raise SlurmError(f"invalid Slurm name {text!r}")
    return text
