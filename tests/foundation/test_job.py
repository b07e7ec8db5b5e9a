"""guardctl.slurm.job: one job object over any SlurmClient, here the in-memory Slurm."""

from __future__ import annotations

import pytest

from guardctl.errors import UsageError
from guardctl.slurm.job import GONE, Job, signal_name, wait_all
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest


def make(n: int = 3, **kw: object) -> MemorySlurm:
    return MemorySlurm([f"node{i}" for i in range(1, n + 1)], **kw)  # type: ignore[arg-type]


def submit(slurm: MemorySlurm, **kw: object) -> Job:
    return Job.submit(
        slurm,
        SubmitRequest(script="x.sbatch", **kw),  # type: ignore[arg-type]
        clock=slurm.time,
        sleep=slurm.sleep,
    )


def test_wait_returns_when_the_job_ends_on_the_clusters_clock() -> None:
    slurm = make(runtime=lambda _info: 42.0)
    job = submit(slurm, nodes=("node1",))
    notes: list[tuple[int, int]] = []
    assert job.wait(600, poll_s=5, progress=lambda d, t, _r: notes.append((d, t)))
    assert job.state == "COMPLETED" and job.exit_code == 0
    assert 42 <= slurm.now - slurm.job(job.job_id).submit_time <= 45  # type: ignore[union-attr]
    assert notes[0] == (0, 1)


def test_wait_times_out_and_says_so() -> None:
    slurm = make()
    job = submit(slurm, nodes=("node1",))
    assert not job.wait(60, poll_s=7)
    assert job.state == "RUNNING" and 60 <= slurm.now - 1_800_000_000.0 < 61
    job.cancel()
    assert job.refresh() == "CANCELLED"


def test_wait_all_reads_the_queue_once_per_poll() -> None:
    slurm = make(runtime=lambda info: 10.0 * int(info.name))
    reads = 0
    original = slurm.jobs

    def counting() -> list:  # type: ignore[type-arg]
        nonlocal reads
        reads += 1
        return original()

    slurm.jobs = counting  # type: ignore[method-assign]
    jobs = [submit(slurm, job_name=str(i), node_count=1) for i in (1, 2, 3)]
    assert wait_all(jobs, timeout_s=100, poll_s=10) == []
    assert [j.state for j in jobs] == ["COMPLETED"] * 3
    assert reads <= 4


def test_a_job_slurm_forgot_is_gone() -> None:
    slurm = make(min_job_age_s=5)
    job = submit(slurm, nodes=("node1",))
    slurm.finish(job.job_id)
    slurm.advance(10)
    assert job.refresh() == GONE and job.ended


def test_requeue_with_exclude_moves_the_job_and_remembers_every_exclusion() -> None:
    slurm = make(3)
    job = submit(slurm, node_count=1)
    assert job.refresh() == "RUNNING" and job.info and job.info.nodes == ("node1",)
    job.requeue(exclude=["node1"])
    job.refresh()
    assert job.state == "RUNNING" and job.info and job.info.nodes == ("node2",)
    job.requeue(exclude=["node2"])
    assert slurm.excluded(job.job_id) == {"node1", "node2"}
    assert job.refresh() == "RUNNING" and job.info and job.info.nodes == ("node3",)
    with pytest.raises(UsageError):
        job.requeue(exclude=["node1;reboot"])


def test_requeue_keeps_the_users_own_exclusions() -> None:
    # Slurm replaces ExcNodeList on update: the user's own --exclude must survive a requeue.
    slurm = make(3)
    blocker = submit(slurm, node_count=3)
    job = submit(slurm, node_count=1)
    slurm.update_job(job.job_id, exclude=["node1"])  # as the user's sbatch --exclude would
    blocker.cancel()
    assert job.refresh() == "RUNNING" and job.info and job.info.nodes == ("node2",)
    assert job.info.excluded == ("node1",)
    job.requeue(exclude=["node2"])
    assert slurm.excluded(job.job_id) == {"node1", "node2"}
    assert job.refresh() == "RUNNING" and job.info and job.info.nodes == ("node3",)


def test_requeue_releases_the_hold_even_when_the_update_fails() -> None:
    slurm = make(2)
    job = submit(slurm, node_count=1)
    with pytest.raises(Exception, match="Invalid node name"):
        job.requeue(exclude=["node7"])
    assert job.refresh() == "RUNNING"  # not left held


def test_signal_names() -> None:
    assert signal_name("usr1") == signal_name("SIGUSR1") == signal_name("10") == "USR1"
    with pytest.raises(UsageError):
        signal_name("BOGUS")
    slurm = make(1)
    job = submit(slurm, nodes=("node1",))
    job.signal("USR1")
    assert slurm.signals(job.job_id) == ["USR1"]
