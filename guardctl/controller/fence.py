"""The controller's fence: nothing it does to Slurm or writes to the action log outlives its lease.

The controller hands its node-action door (:class:`~guardctl.nodeops.NodeOps`) a Slurm client
and an action log wrapped here. Every call that changes Slurm (drain, resume, a reservation, a
sweep job submitted or cancelled, a requeue, a signal) and every entry appended to the log (or
checkpoint of it) first takes the store's action lock and checks the lease
(:meth:`~guardctl.controller.lease.Lease.check`), and runs under that lock; a lost lease raises
:class:`~guardctl.controller.lease.LeaseLost` instead, so a controller that was paused past its
lease and wakes in the middle of a pass does nothing more. Reads go straight through, and so
does the release of a job's hold, which only undoes guardctl's own requeue.

Only the controller is fenced: an operator's one-off ``guardctl drain`` or ``quarantine`` is
not a controller and builds its own NodeOps, unwrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from guardctl.actionlog import ActionLog, Entry
from guardctl.slurm.types import JobInfo, NodeInfo, ReservationInfo, SlurmClient, SubmitRequest
from guardctl.topology import Topology

Guard = Callable[[], AbstractContextManager[Any]]


class FencedSlurm:
    """A Slurm client whose every change runs under *guard* (the lock and the lease check)."""

    def __init__(self, inner: SlurmClient, guard: Guard) -> None:
        self.inner = inner
        self.guard = guard

    # -- reads ---------------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        return self.inner.nodes()

    def jobs(self) -> list[JobInfo]:
        return self.inner.jobs()

    def recent_jobs(self) -> list[JobInfo]:
        return self.inner.recent_jobs()

    def reservations(self) -> list[ReservationInfo]:
        return self.inner.reservations()

    def job(self, job_id: int) -> JobInfo | None:
        return self.inner.job(job_id)

    def topology(self) -> Topology | None:
        return self.inner.topology()

    # -- changes -------------------------------------------------------------------------
    def drain(self, nodes: Sequence[str], reason: str) -> None:
        with self.guard():
            self.inner.drain(nodes, reason)

    def resume(self, nodes: Sequence[str]) -> None:
        with self.guard():
            self.inner.resume(nodes)

    def create_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        users: Sequence[str],
        flags: Sequence[str] = ("MAINT", "IGNORE_JOBS"),
    ) -> None:
        with self.guard():
            self.inner.create_reservation(name, nodes, users, flags)

    def delete_reservation(self, name: str) -> None:
        with self.guard():
            self.inner.delete_reservation(name)

    def submit(self, request: SubmitRequest) -> int:
        with self.guard():
            return self.inner.submit(request)

    def cancel(self, job_id: int) -> None:
        with self.guard():
            self.inner.cancel(job_id)

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        with self.guard():
            self.inner.requeue(job_id, hold=hold)

    def release_hold(self, job_id: int) -> None:
        # Not fenced: it only undoes the hold guardctl's own requeue put on the job (its log
        # says so), and a leader deposed between the two must not leave a user's job held.
        self.inner.release_hold(job_id)

    def update_job(self, job_id: int, *, exclude: Sequence[str]) -> None:
        with self.guard():
            self.inner.update_job(job_id, exclude=exclude)

    def signal(self, job_id: int, signal: str) -> None:
        with self.guard():
            self.inner.signal(job_id, signal)


class FencedLog(ActionLog):
    """The action log, whose every append runs under *guard*."""

    def __init__(self, root: Path, clock: Callable[[], float], guard: Guard) -> None:
        super().__init__(root, clock)
        self.guard = guard

    def append(self, entry: Entry) -> Entry:
        with self.guard():
            return super().append(entry)

    def checkpoint(self, keep: Callable[[list[Entry]], Sequence[Entry]]) -> Path | None:
        with self.guard():  # a deposed leader rewrites nothing either
            return super().checkpoint(keep)
