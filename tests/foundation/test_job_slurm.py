"""guardctl.slurm.job against the real local Slurm: requeue away from a node, signal, cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guardctl.sections.slurm import SlurmSettings
from guardctl.slurm.cli_backend import CliSlurm
from guardctl.slurm.job import Job
from guardctl.slurm.types import SubmitRequest

pytestmark = pytest.mark.slurm


def client(lab: Any) -> CliSlurm:
    # On another release the lab's own commands: the host's sbatch cannot talk to its controller.
    settings = SlurmSettings(conf=str(lab.conf), timeout_s=20.0, bin_dir=str(lab.bin_dir or ""))
    return CliSlurm(settings, environ=lab.env)


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    tmp_path.chmod(0o755)
    return str(path)


def wait_running(job: Job, timeout: float = 60) -> None:
    deadline = job.clock() + timeout
    while job.refresh() != "RUNNING":
        assert job.clock() < deadline, f"job {job.job_id} is {job.state}"
        job.sleep(0.3)


def train(slurm: CliSlurm, tmp_path: Path, body: str) -> Job:
    """A one-node training job running *body*, submitted."""
    request = SubmitRequest(
        script=script(tmp_path, body),
        job_name="train",
        node_count=1,
        output=str(tmp_path / "out-%j"),
        time_limit_min=10,
    )
    return Job.submit(slurm, request)


def test_requeued_with_a_node_excluded_lands_elsewhere(lab: Any, tmp_path: Path) -> None:
    job = train(client(lab), tmp_path, "sleep 300\n")
    try:
        wait_running(job)
        first = job.info.nodes if job.info else ()
        assert len(first) == 1
        job.requeue(exclude=first)
        # Slurm shows the old run ending (COMPLETING), then the job pending again.
        assert job.refresh() in ("COMPLETING", "PENDING", "REQUEUED", "RUNNING")
        wait_running(job, timeout=90)  # a requeued job waits out the credential (~11 s)
        assert job.info is not None and job.info.nodes and job.info.nodes != first
        assert job.excluded == first
    finally:
        job.cancel()
    # 24.11+'s plain squeue drops an ended job within a second or two: the job is read with
    # the ended ones (--states=all), so its final state is seen, not merely GONE.
    assert job.wait(60, poll_s=0.3) and job.state == "CANCELLED"


def test_requeue_keeps_the_users_exclude(lab: Any, tmp_path: Path) -> None:
    # The user's own --exclude is part of ExcNodeList, which an update replaces whole.
    slurm = client(lab)
    job = train(slurm, tmp_path, "#SBATCH --exclude=node1\nsleep 300\n")
    try:
        wait_running(job)
        assert job.info is not None and job.info.excluded == ("node1",)
        first = job.info.nodes
        job.requeue(exclude=first)
        info = slurm.job(job.job_id)
        assert info is not None and set(info.excluded) == {"node1", *first}
        wait_running(job, timeout=90)
        assert job.info is not None and set(job.info.nodes).isdisjoint({"node1", *first})
    finally:
        job.cancel()


def test_signal_reaches_the_batch_script(lab: Any, tmp_path: Path) -> None:
    slurm = client(lab)
    marker = tmp_path / "got-usr1"
    body = f"trap 'touch {marker}; exit 0' USR1\nfor i in $(seq 600); do sleep 0.1; done\n"
    job = Job.submit(
        slurm,
        SubmitRequest(
            script=script(tmp_path, body), job_name="sig", nodes=("node2",), output="/dev/null"
        ),
    )
    try:
        wait_running(job)
        job.signal("usr1")
        assert job.wait(60, poll_s=0.3)
    finally:
        if not job.ended:
            job.cancel()
    assert marker.exists() and job.state == "COMPLETED"


def test_wait_times_out_then_cancel(lab: Any, tmp_path: Path) -> None:
    slurm = client(lab)
    job = Job.submit(
        slurm,
        SubmitRequest(script=script(tmp_path, "sleep 120\n"), nodes=("node3",), output="/dev/null"),
    )
    assert not job.wait(2, poll_s=0.5)
    job.cancel()
    assert job.wait(60, poll_s=0.3) and job.state == "CANCELLED"
    assert slurm.job(10**9) is None
