"""A requeue left half done: the job must never stay held by guardctl.

The controller's requeue is ``scontrol requeuehold``, the node in ExcNodeList, then ``scontrol
release``. A release that fails, or a crash between the hold and the release, leaves the job
held; the next acting pass's reconcile releases it, and only a job guardctl's own log says it
held. Each test asserts what Slurm shows afterwards and what the action log says: over the
in-memory Slurm, and on the lab for Slurm's own hold.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from controltools import control_guardctl, fleet_trace
from test_controller_slurm import control, decision, entries, held_job

from guardctl.actionlog import Entry
from guardctl.clock import Clock
from guardctl.config import load_settings
from guardctl.controller.lease import LeaseLost
from guardctl.controller.loop import Controller, counts_toward_cap
from guardctl.errors import RefusedError, SlurmError, SlurmUnavailable
from guardctl.nodeops.ownership import REQUEUE
from guardctl.nodeops.reconcile import HELD_REASONS
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import JobInfo, SubmitRequest
from guardctl.testhooks import CRASH_ENV

NODES = ["node1", "node2", "node3", "node4"]
CHEAP = {"requeue": True, "checkpoint_interval_s": 0.0, "restart_s": 0.0, "queue_wait_s": 0.0}


class Killed(BaseException):
    """The process dies here (what SIGKILL does to a controller: nothing after it runs)."""


class FaultySlurm:
    """The in-memory Slurm, with faults injected into a requeue's steps."""

    def __init__(self, slurm: MemorySlurm) -> None:
        self.slurm = slurm
        self.release_fails: type[SlurmError] | None = None  # scontrol release answers this
        self.killed_after_hold = False  # the controller dies once Slurm has held the job
        self.after_hold: Callable[[], None] = lambda: None  # what happens once it is held

    def __getattr__(self, name: str) -> Any:
        return getattr(self.slurm, name)

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self.slurm.requeue(job_id, hold=hold)
        if hold and self.killed_after_hold:
            raise Killed()
        if hold:
            self.after_hold()

    def release_hold(self, job_id: int) -> None:
        if self.release_fails is not None:
            raise self.release_fails(f"scontrol release {job_id}: Socket timed out on send/recv")
        self.slurm.release_hold(job_id)


class PausedClock(Clock):
    """This host's clocks, its monotonic one moved on by hand for the time the process stood
    still (SIGSTOP, a VM migration)."""

    def __init__(self) -> None:
        super().__init__()
        self.boot = "test-paused"
        self.stood_s = 0.0

    def mono(self) -> float:
        return time.monotonic() + self.stood_s


def controller(
    tmp_path: Path, slurm: Any, *, observe_only: bool = False, clock: Clock | None = None
) -> Controller:
    settings = load_settings(environ={"GUARDCTL_STORE": str(tmp_path)})
    settings = dataclasses.replace(
        settings,
        control=dataclasses.replace(settings.control, **CHEAP),  # type: ignore[arg-type]
        safety=dataclasses.replace(settings.safety, observe_only=observe_only),
    )
    c = Controller(settings, act=True, slurm=slurm, clock=clock)
    c.as_daemon(c.cfg.interval_s)  # a sweep is started by a pass, not waited for
    return c


def training(slurm: MemorySlurm, node: str = "", name: str = "train") -> int:
    """A requeue-able job on *node*, or on the first free node (one it may leave)."""
    pinned = {"nodes": (node,)} if node else {"node_count": 1}
    job = slurm.submit(SubmitRequest("train.sbatch", job_name=name, **pinned))
    slurm.advance(1)
    return job


def info(slurm: MemorySlurm, job: int) -> JobInfo:
    found = slurm.job(job)
    assert found is not None
    return found


def requeues(c: Controller) -> list[Entry]:
    return [e for e in c.ops.log.entries() if e.action == REQUEUE]


def quarantined_with_a_job(
    tmp_path: Path, clock: Clock | None = None
) -> tuple[MemorySlurm, FaultySlurm, Controller, int]:
    """node2 slow under a requeue-able training job; the first pass quarantined it."""
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    training(slurm, "node1", "serve")
    job = training(slurm)
    assert info(slurm, job).nodes == ("node2",)
    faulty = FaultySlurm(slurm)
    c = controller(tmp_path, faulty, clock=clock)
    (first,) = c.run_pass().decisions
    assert (first["decision"], first["outcome"]) == ("quarantine", "done")
    return slurm, faulty, c, job


def fail_the_release(
    c: Controller, faulty: FaultySlurm, error: type[SlurmError] = SlurmError
) -> None:
    """A pass whose requeue's release fails. Refused: the decision's outcome says so, and the
    other decisions go on; not answered: the pass stops (Slurm is down: nothing more is tried).
    Either way the job is left held."""
    faulty.release_fails = error
    try:
        (d,) = c.run_pass().decisions
    except SlurmError as exc:
        assert "scontrol release" in str(exc)
    else:
        assert d["decision"] == "requeue" and d["outcome"].startswith("failed: scontrol release")
        assert error is not SlurmUnavailable
    faulty.release_fails = None


@pytest.mark.parametrize("error", [SlurmError, SlurmUnavailable], ids=["refused", "timed-out"])
def test_a_requeue_whose_release_fails_is_released_by_the_next_pass(
    tmp_path: Path, error: type[SlurmError]
) -> None:
    slurm, faulty, c, job = quarantined_with_a_job(tmp_path)
    fail_the_release(c, faulty, error)
    held = info(slurm, job)
    assert (held.state, held.reason) == ("PENDING", "JobHeldAdmin")
    assert slurm.excluded(job) == {"node2"} and slurm.restarts(job) == 1
    left = requeues(c)

    report = c.run_pass()  # Slurm answers again: the next pass releases the job first
    moved = info(slurm, job)
    assert (moved.state, moved.nodes) == ("RUNNING", ("node3",))  # not node2: excluded
    assert slurm.restarts(job) == 1  # released, not requeued again
    # refused: the outcome says the job may be left held; timed out: the intent stays open
    assert [e.phase for e in left] == (["intent", "failed"] if error is SlurmError else ["intent"])
    assert left[-1].evidence.get("held", True) is True
    assert report.reconciled >= 1
    last = requeues(c)[-1]
    assert (last.phase, last.evidence["job"], last.evidence["released"]) == (
        "reconciled",
        job,
        True,
    )
    assert last.id == requeues(c)[0].id and last.nodes == ("node2",)
    assert sum(counts_toward_cap(e) for e in requeues(c)) == 1  # one requeue for the cap
    c.run_pass()
    assert requeues(c)[-1] == last  # settled: nothing more to do


def test_a_crash_between_the_hold_and_the_release_is_reconciled(tmp_path: Path) -> None:
    slurm, faulty, c, job = quarantined_with_a_job(tmp_path)
    faulty.killed_after_hold = True
    with pytest.raises(Killed):
        c.run_pass()
    faulty.killed_after_hold = False
    held = info(slurm, job)
    assert (held.state, held.reason) == ("PENDING", "JobHeldAdmin")
    left = requeues(c)

    c.run_pass()  # the next pass (the crashed one's step no longer runs) releases it
    assert info(slurm, job).state == "RUNNING"
    assert [e.phase for e in left] == ["intent"]  # what a crash leaves: no outcome
    phases = [(e.phase, e.evidence.get("released")) for e in requeues(c)]
    assert phases == [("intent", None), ("reconciled", True)]


def test_a_leader_that_loses_its_lease_between_the_hold_and_the_release_still_releases(
    tmp_path: Path,
) -> None:
    """Releasing the hold only undoes what this requeue did a moment before: a leader deposed
    in the middle (it stood still past its lease) does nothing more, but it does not leave
    the job held until it dies."""
    clock = PausedClock()
    slurm, faulty, c, job = quarantined_with_a_job(tmp_path, clock)

    def stood_still() -> None:
        clock.stood_s += c.cfg.lease_s + 5

    faulty.after_hold = stood_still
    with pytest.raises(LeaseLost):
        c.run_pass()  # held; then the update is fenced: the lease ran out meanwhile
    faulty.after_hold = lambda: None
    moved = info(slurm, job)
    assert moved.state == "RUNNING" and "node2" not in moved.nodes, moved
    assert [e.phase for e in requeues(c)] == ["intent"]  # a deposed leader writes nothing


def test_a_job_someone_else_held_is_never_released(tmp_path: Path) -> None:
    slurm, faulty, c, job = quarantined_with_a_job(tmp_path)
    theirs = training(slurm, "node3", "theirs")
    fail_the_release(c, faulty)
    slurm.requeue(theirs, hold=True)  # an administrator's requeuehold: not guardctl's
    assert info(slurm, theirs).reason == "JobHeldAdmin"

    c.run_pass()
    assert info(slurm, job).state == "RUNNING"  # guardctl's hold: released
    kept = info(slurm, theirs)
    assert (kept.state, kept.reason) == ("PENDING", "JobHeldAdmin")  # theirs: left alone
    assert all(e.evidence["job"] == job for e in requeues(c))

    # The job guardctl requeued and released, held later by an administrator: theirs now.
    slurm.requeue(job, hold=True)
    c.run_pass()
    again = info(slurm, job)
    assert (again.state, again.reason) == ("PENDING", "JobHeldAdmin")
    assert [e.phase for e in requeues(c)] == ["intent", "failed", "reconciled"]


def test_a_job_that_ended_meanwhile_closes_its_requeue_without_touching_slurm(
    tmp_path: Path,
) -> None:
    slurm, faulty, c, job = quarantined_with_a_job(tmp_path)
    fail_the_release(c, faulty)
    slurm.cancel(job)  # its user gave up on it
    c.run_pass()
    last = requeues(c)[-1]
    assert (last.phase, last.evidence["released"]) == ("reconciled", False)
    assert "CANCELLED" in last.evidence["found"] and info(slurm, job).state == "CANCELLED"


def test_observe_only_neither_requeues_nor_releases(tmp_path: Path) -> None:
    slurm, faulty, c, job = quarantined_with_a_job(tmp_path)
    other = training(slurm, "node3", "other")
    fail_the_release(c, faulty)  # an acting pass left the job held
    c.lease.release()
    watcher = controller(tmp_path, faulty, observe_only=True)
    assert watcher.run_pass().leader
    held = info(slurm, job)
    assert (held.state, held.reason) == ("PENDING", "JobHeldAdmin")  # not released
    assert [e.phase for e in requeues(c)] == ["intent", "failed"]
    with pytest.raises(RefusedError, match="observe_only"):
        watcher.ops.requeue(other, "node3", "by hand")
    assert info(slurm, other).state == "RUNNING" and slurm.restarts(other) == 0
    assert [e.phase for e in requeues(c)] == ["intent", "failed"]


def test_observe_only_would_requeue_and_changes_nothing(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = training(slurm, "node2")
    acting = controller(tmp_path, slurm)
    acting.run_pass()  # quarantined by an acting controller, which then stops
    acting.lease.release()
    watcher = controller(tmp_path, slurm, observe_only=True)
    (d,) = watcher.run_pass().decisions
    assert (d["decision"], d["outcome"]) == ("requeue", "would do")
    assert info(slurm, job).state == "RUNNING" and slurm.restarts(job) == 0
    assert requeues(watcher) == []


@pytest.mark.slurm
def test_on_the_lab_a_job_a_crashed_requeue_left_held_is_released_by_the_next_pass(
    lab: Any, tmp_path: Path
) -> None:
    """Slurm's own hold: ``scontrol requeuehold`` leaves the job pending with priority 0 (22.05:
    job_requeued_in_held_state); the controller killed right after it, the next pass releases
    the job, which runs again."""
    g = control_guardctl(
        tmp_path,
        lab,
        control="".join(f"{key} = {str(value).lower()}\n" for key, value in CHEAP.items()),
    )
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    job, stop = held_job(
        lab, tmp_path, "node2", "--requeue", "-t", "30", elsewhere="node1,node3,node4"
    )
    try:
        assert decision(control(g, "--act"), "node2")["decision"] == "quarantine"
        env = {**g.env, CRASH_ENV: "requeue:held"}
        proc = subprocess.run(
            g.cmd("control", "--once", "--act"),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 99, proc.stdout + proc.stderr  # killed once Slurm held it
        held = lab_job(lab, job, lambda i: i.get("JobState") == "PENDING")
        assert held.get("Reason") in HELD_REASONS and held.get("Priority") == "0", held

        control(g, "--act")  # its reconcile releases the job first
        again = lab_job(lab, job, lambda i: i.get("JobState") == "RUNNING")
        assert int(again.get("Restarts", "0")) == 1, again  # the one requeue, run again
        mine = [e for e in entries(g) if e["action"] == REQUEUE]
        assert [(e["phase"], e["evidence"].get("released")) for e in mine] == [
            ("intent", None),
            ("reconciled", True),
        ]
    finally:
        stop.touch()
        os.sync()


def lab_job(
    lab: Any, job: str, until: Callable[[dict[str, str]], bool], timeout: float = 60
) -> dict[str, str]:
    """The lab's job once *until* holds (``scontrol show job``)."""
    deadline = time.monotonic() + timeout
    while not until(found := lab.job_info(job)):
        assert time.monotonic() < deadline, found
        time.sleep(0.3)
    return found
