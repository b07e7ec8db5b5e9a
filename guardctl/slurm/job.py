"""A Slurm job as one object: submit it, read its state, wait, cancel, requeue, signal.

The sweep engine and the mitigation controller both drive jobs through this, as ReFrame's
scheduler jobs do, so that "wait for a job with a timeout" or "requeue it away from a bad node"
is written once. It talks to Slurm only through a :class:`~guardctl.slurm.types.SlurmClient`,
so the same code runs against the real Slurm and the in-memory one
(:mod:`guardctl.slurm.memory`); time is read and slept through two callables so that a
simulation can drive it on its own clock.
"""

from __future__ import annotations

import signal as _signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from guardctl import testhooks
from guardctl.errors import SlurmError, SlurmUnavailable, UsageError
from guardctl.nodes import validate_name
from guardctl.slurm.types import JobInfo, SlurmClient, SubmitRequest

GONE = "GONE"  # Slurm no longer lists the job (MinJobAge after it ended): it has ended
Clock = Callable[[], float]
Sleep = Callable[[float], None]
Progress = Callable[[int, int, "list[Job]"], None]  # (jobs ended, jobs in all, still running)


def signal_name(text: str) -> str:
    """``"usr1"``, ``"SIGUSR1"`` or ``"10"`` as the name scancel takes (``USR1``)."""
    word = str(text).strip().upper()
    try:
        number = int(word)
    except ValueError:
        number = None
    try:
        sig = (
            _signal.Signals(number)
            if number is not None
            else _signal.Signals[word if word.startswith("SIG") else f"SIG{word}"]
        )
    except (KeyError, ValueError):
        raise UsageError(f"unknown signal {text!r}") from None
    return sig.name.removeprefix("SIG")


@dataclass
class Job:
    """One Slurm job, by id; :attr:`info` is what Slurm said at the last look."""

    slurm: SlurmClient
    job_id: int
    tag: str = ""  # what the caller calls it (a sweep's job tag)
    clock: Clock = time.monotonic
    sleep: Sleep = time.sleep
    info: JobInfo | None = None
    gone: bool = False  # Slurm no longer lists it
    excluded: tuple[str, ...] = ()  # nodes this job was told to avoid, all requeues together
    held: bool = False  # a requeue's hold may still be on the job (its release not yet done)

    @classmethod
    def submit(
        cls,
        slurm: SlurmClient,
        request: SubmitRequest,
        *,
        tag: str = "",
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
    ) -> Job:
        """Submit *request* (sbatch) and return the job."""
        return cls(
            slurm, slurm.submit(request), tag=tag or request.job_name, clock=clock, sleep=sleep
        )

    # -- reading -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """Slurm's state at the last look (upper case), or ``GONE``; ``""`` before any look."""
        if self.gone:
            return GONE
        return self.info.state if self.info is not None else ""

    @property
    def ended(self) -> bool:
        """True once the job is in a final state or Slurm has forgotten it."""
        return self.gone or (self.info is not None and self.info.finished)

    @property
    def exit_code(self) -> int | None:
        return self.info.exit_code if self.info is not None else None

    def observe(self, info: JobInfo | None) -> None:
        """Take in what Slurm says now (None: not listed, so purged after it ended)."""
        if info is None:
            self.gone = True
        else:
            self.gone, self.info = False, info

    def refresh(self) -> str:
        """Ask Slurm for this job's state now; returns :attr:`state`."""
        self.observe(self.slurm.job(self.job_id))
        return self.state

    def wait(
        self,
        timeout_s: float,
        *,
        poll_s: float = 2.0,
        progress: Progress | None = None,
        progress_every_s: float = 10.0,
    ) -> bool:
        """Wait until the job ends or *timeout_s* passes; True when it ended."""
        return not wait_all(
            [self],
            timeout_s=timeout_s,
            poll_s=poll_s,
            progress=progress,
            progress_every_s=progress_every_s,
        )

    # -- acting --------------------------------------------------------------------------
    def cancel(self) -> None:
        self.slurm.cancel(self.job_id)

    def signal(self, sig: str) -> None:
        """Send *sig* to the job's steps and its batch script (a checkpoint request, say)."""
        self.slurm.signal(self.job_id, signal_name(sig))

    def requeue(self, exclude: Sequence[str] = ()) -> None:
        """Put the job back in the queue; with *exclude*, it may not start on those nodes again.

        ExcNodeList can only be changed while a job is pending, and a plainly requeued job may
        be scheduled again at once: so the job is requeued *held*, its excluded nodes set, and
        then released. The release happens even when the update fails, so that a training
        job is never left held; the error is raised after it.

        When this raises, :attr:`held` says whether the hold may still be on the job: the
        release failed, or Slurm did not answer the requeue (it may have held the job all the
        same). The node-action door records it, and reconcile releases such a job.
        """
        if not exclude:
            self.slurm.requeue(self.job_id)
            self.gone = False
            return
        self.held = True  # before asking: a requeue lost in a timeout may have held it
        try:
            self.slurm.requeue(self.job_id, hold=True)
        except SlurmUnavailable:
            raise
        except SlurmError:
            self.held = False  # refused: Slurm held nothing
            raise
        self.gone = False
        testhooks.crash_point("requeue:held")
        try:
            wanted = self._keep_excluded(exclude)
            self.slurm.update_job(self.job_id, exclude=wanted)
            self.excluded = wanted
        finally:
            self.slurm.release_hold(self.job_id)
            self.held = False

    def _keep_excluded(self, exclude: Sequence[str]) -> tuple[str, ...]:
        """The ExcNodeList to set: the job's own (its user's ``--exclude``, earlier requeues')
        and *exclude*; Slurm replaces the list on update, so a user's list is read first."""
        info = self.slurm.job(self.job_id) or self.info
        own = info.excluded if info is not None else ()
        return tuple(dict.fromkeys([*own, *self.excluded, *(validate_name(n) for n in exclude)]))


def wait_all(
    jobs: Sequence[Job],
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    progress: Progress | None = None,
    progress_every_s: float = 10.0,
) -> list[Job]:
    """Wait until every job has ended or *timeout_s* passed; returns those still running.

    One queue read per poll for all jobs (not one per job), so a batch of hundreds of sweep
    jobs costs what one does. *progress* is told (ended, total, running) when a job ends and
    at least every *progress_every_s* seconds. The jobs share the first job's clock.
    """
    if not jobs:
        return []
    if timeout_s < 0 or poll_s <= 0:
        raise UsageError("wait: timeout must be >= 0 and the poll interval positive")
    clock, sleep, slurm = jobs[0].clock, jobs[0].sleep, jobs[0].slurm
    deadline = clock() + timeout_s
    last_note, last_done = float("-inf"), -1
    while True:
        running = [j for j in jobs if not j.ended]
        if running:
            seen = {i.job_id: i for i in _read(slurm, running)}
            for job in running:
                job.observe(seen.get(job.job_id))
            running = [j for j in running if not j.ended]
        done, now = len(jobs) - len(running), clock()
        if not running:
            return []
        if progress is not None and (done != last_done or now - last_note >= progress_every_s):
            progress(done, len(jobs), running)
            last_note, last_done = now, done
        if now >= deadline:
            return running
        sleep(min(poll_s, max(0.0, deadline - now)) or poll_s)


def _read(slurm: SlurmClient, jobs: Sequence[Job]) -> list[JobInfo]:
    if len(jobs) == 1:
        one = slurm.job(jobs[0].job_id)
        return [one] if one is not None else []
    return slurm.recent_jobs()  # ended ones too: a final state and exit code, not only GONE
