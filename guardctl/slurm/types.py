"""Typed view of Slurm objects and the client interface every backend implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from guardctl.topology import Topology


@dataclass(frozen=True)
class NodeInfo:
    """One node as Slurm reports it."""

    name: str
    state: str  # base state, lower case: idle, allocated, mixed, down, unknown, ...
    flags: frozenset[str] = frozenset()  # upper case: DRAIN, MAINTENANCE, RESERVED, NOT_RESPONDING
    reason: str = ""
    reason_user: str = ""
    reason_time: float | None = None  # Unix seconds
    partitions: tuple[str, ...] = ()
    cpus: int = 0
    gres: str = ""

    @property
    def drained(self) -> bool:
        """True when the node takes no new jobs because of a drain (DRAINING or DRAINED)."""
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return self.state in ("down", "fail") or "FAIL" in self.flags

    @property
    def slurm_state(self) -> str:
        """The state the way sinfo prints it: ``idle+drain``, ``mixed+maintenance``."""
        extra = sorted(f.lower() for f in self.flags)
        return "+".join([self.state, *extra])


@dataclass(frozen=True)
class JobInfo:
    """One job as squeue reports it (pending, running, or recently finished)."""

    job_id: int
    name: str
    user: str
    state: str  # upper case: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    nodes: tuple[str, ...] = ()
    reservation: str = ""
    partition: str = ""
    exit_code: int | None = None
    reason: str = ""  # why it is pending
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None  # of a running job: when its time limit ends it
    requeue: bool = False  # Slurm may requeue it (sbatch --requeue or JobRequeue=1)
    excluded: tuple[str, ...] = ()  # its ExcNodeList (sbatch --exclude, or a requeue's)

    @property
    def finished(self) -> bool:
        return self.state not in (
            "PENDING",
            "RUNNING",
            "CONFIGURING",
            "COMPLETING",
            "SUSPENDED",
            "REQUEUED",
            "RESIZING",
            "SIGNALING",
            "STAGE_OUT",
        )


@dataclass(frozen=True)
class ReservationInfo:
    """One reservation as ``scontrol show reservation`` reports it."""

    name: str
    nodes: tuple[str, ...]
    users: tuple[str, ...]
    flags: frozenset[str]  # upper case: MAINT, IGNORE_JOBS, OVERLAP, SPEC_NODES, ...
    start_time: float | None = None
    end_time: float | None = None
    state: str = ""  # ACTIVE / INACTIVE


@dataclass(frozen=True)
class SubmitRequest:
    """An sbatch submission, built as data so dry runs can print it."""

    script: str  # path of the batch script
    args: tuple[str, ...] = ()  # arguments to the script
    job_name: str = "guardctl"
    nodes: tuple[str, ...] = ()  # -w: exactly these nodes
    node_count: int | None = None  # -N
    reservation: str = ""
    partition: str = ""
    time_limit_min: int | None = None
    output: str = ""  # -o path
    ntasks_per_node: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # exported in addition to the caller's
    extra: tuple[str, ...] = ()  # further sbatch options, each a full "--opt=value" word


class SlurmClient(Protocol):
    """What guardctl needs from Slurm. Every method raises SlurmError / SlurmUnavailable."""

    def nodes(self) -> list[NodeInfo]: ...

    def jobs(self) -> list[JobInfo]: ...

    def recent_jobs(self) -> list[JobInfo]:
        """Every job the controller still holds, whatever its state: pending, running, and
        ended within MinJobAge (``squeue --states=all``), each with its nodes, start and end
        (which job ran on which node when)."""
        ...

    def reservations(self) -> list[ReservationInfo]: ...

    def topology(self) -> Topology | None:
        """The network tree of Slurm's topology plugin (``scontrol show topology``: tree or
        block), or None when the cluster has none configured."""
        ...

    def drain(self, nodes: Sequence[str], reason: str) -> None: ...

    def resume(self, nodes: Sequence[str]) -> None: ...

    def create_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        users: Sequence[str],
        flags: Sequence[str] = ("MAINT", "IGNORE_JOBS"),
    ) -> None: ...

    def delete_reservation(self, name: str) -> None: ...

    def submit(self, request: SubmitRequest) -> int: ...

    def cancel(self, job_id: int) -> None: ...

    # -- one job (guardctl.slurm.job.Job is built on these) ---------------------------------
    def job(self, job_id: int) -> JobInfo | None:
        """The job, or None once Slurm has forgotten it (MinJobAge after it ended)."""
        ...

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        """Put a batch job back in the queue (``scontrol requeue``; ``requeuehold``: held)."""
        ...

    def release_hold(self, job_id: int) -> None:
        """Let a held job be scheduled again (``scontrol release``)."""
        ...

    def update_job(self, job_id: int, *, exclude: Sequence[str]) -> None:
        """Keep a pending job off *exclude* (``scontrol update JobId=.. ExcNodeList=..``)."""
        ...

    def signal(self, job_id: int, signal: str) -> None:
        """Send *signal* (``USR1``, ``TERM``, ...) to every step, the batch script included."""
        ...
