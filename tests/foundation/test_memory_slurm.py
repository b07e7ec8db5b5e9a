"""The in-memory Slurm behaves as the real one does where guardctl relies on it."""

from __future__ import annotations

import pytest

from guardctl.errors import SlurmError
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SlurmClient, SubmitRequest


def cluster(n: int = 4, **kw: object) -> MemorySlurm:
    return MemorySlurm([f"node{i}" for i in range(1, n + 1)], **kw)  # type: ignore[arg-type]


def job(**kw: object) -> SubmitRequest:
    return SubmitRequest(script="train.sbatch", **kw)  # type: ignore[arg-type]


def states(slurm: MemorySlurm) -> dict[str, str]:
    return {n.name: n.slurm_state for n in slurm.nodes()}


def test_it_is_a_slurm_client() -> None:
    client: SlurmClient = cluster()
    assert [n.name for n in client.nodes()] == ["node1", "node2", "node3", "node4"]


def test_drain_and_resume_rules() -> None:
    slurm = cluster()
    with pytest.raises(SlurmError, match="reason"):
        slurm.drain(["node1"], " ")
    with pytest.raises(SlurmError, match="Invalid node state"):
        slurm.resume(["node1"])  # an idle node cannot be resumed
    with pytest.raises(SlurmError, match="Invalid node name"):
        slurm.drain(["node9"], "x")
    slurm.advance(5)
    slurm.drain(["node1"], "admin: bad DIMM")
    node = {n.name: n for n in slurm.nodes()}["node1"]
    assert node.drained and node.reason == "admin: bad DIMM" and node.reason_time == slurm.now
    slurm.resume(["node1"])
    assert states(slurm)["node1"] == "idle"


def test_a_draining_node_keeps_its_job_and_takes_no_new_one() -> None:
    slurm = cluster(2)
    first = slurm.submit(job(nodes=("node1",)))
    slurm.drain(["node1"], "slow")
    assert states(slurm)["node1"] == "allocated+drain"
    second = slurm.submit(job(nodes=("node1",)))
    assert slurm.job(second).state == "PENDING"  # type: ignore[union-attr]
    slurm.finish(first)
    assert states(slurm)["node1"] == "idle+drain"
    assert slurm.job(second).reason == "ReqNodeNotAvail"  # type: ignore[union-attr]


def test_maintenance_reservation_semantics() -> None:
    slurm = cluster()
    running = slurm.submit(job(nodes=("node2",)))
    with pytest.raises(SlurmError, match="busy"):  # a job runs there and no IGNORE_JOBS
        slurm.create_reservation("plain", ["node2"], ["root"], ("MAINT",))
    slurm.create_reservation("guardctl_q_node2", ["node2"], ["root"])
    assert slurm.job(running).state == "RUNNING"  # type: ignore[union-attr]  # IGNORE_JOBS
    assert states(slurm)["node2"] == "allocated+maintenance+reserved"
    with pytest.raises(SlurmError, match="Duplicate"):
        slurm.create_reservation("guardctl_q_node2", ["node3"], ["root"])
    # A MAINT reservation may overlap others and be overlapped; two plain ones may not.
    slurm.create_reservation("guardctl_s_1", ["node2", "node3"], ["root"])
    slurm.create_reservation("other", ["node3"], ["root"], ("IGNORE_JOBS",))
    with pytest.raises(SlurmError, match="busy"):
        slurm.create_reservation("third", ["node3"], ["root"], ("IGNORE_JOBS",))
    slurm.delete_reservation("other")
    slurm.finish(running)
    ordinary = slurm.submit(job(nodes=("node2",)))
    sweep = slurm.submit(job(nodes=("node2",), reservation="guardctl_q_node2"))
    assert slurm.job(ordinary).state == "PENDING"  # type: ignore[union-attr]
    assert slurm.job(sweep).state == "RUNNING"  # type: ignore[union-attr]
    with pytest.raises(SlurmError, match="busy"):  # a job runs in it
        slurm.delete_reservation("guardctl_q_node2")
    with pytest.raises(SlurmError, match="reservation is invalid"):
        slurm.submit(job(nodes=("node2",), reservation="nope"))
    slurm.finish(sweep)
    slurm.delete_reservation("guardctl_q_node2")
    slurm.delete_reservation("guardctl_s_1")
    assert slurm.job(ordinary).state == "RUNNING"  # type: ignore[union-attr]
    assert slurm.reservations() == []


def test_requeue_held_with_excluded_node_lands_elsewhere() -> None:
    slurm = cluster(3)
    jid = slurm.submit(job(node_count=1))
    assert slurm.job(jid).nodes == ("node1",)  # type: ignore[union-attr]
    with pytest.raises(SlurmError, match="no longer pending"):
        slurm.update_job(jid, exclude=["node1"])
    slurm.requeue(jid, hold=True)
    assert slurm.job(jid).state == "PENDING"  # type: ignore[union-attr]
    assert slurm.job(jid).reason == "JobHeldAdmin"  # type: ignore[union-attr]
    with pytest.raises(SlurmError, match="pending execution"):
        slurm.requeue(jid)
    slurm.update_job(jid, exclude=["node1"])
    slurm.release_hold(jid)
    info = slurm.job(jid)
    assert info is not None and info.state == "RUNNING" and info.nodes == ("node2",)
    assert slurm.restarts(jid) == 1


def test_no_requeue_jobs_refuse_requeue() -> None:
    slurm = cluster(1)
    jid = slurm.submit(job(nodes=("node1",), extra=("--no-requeue",)))
    with pytest.raises(SlurmError, match="disabled"):
        slurm.requeue(jid)


def test_time_limit_runtime_purge_and_node_failure() -> None:
    slurm = cluster(2, runtime=lambda info: 30.0 if info.name == "short" else None)
    short = slurm.submit(job(job_name="short", nodes=("node1",)))
    limited = slurm.submit(job(job_name="long", nodes=("node2",), time_limit_min=1))
    slurm.advance(29.9)
    assert slurm.job(short).state == "RUNNING"  # type: ignore[union-attr]
    slurm.advance(0.1)
    assert slurm.job(short).state == "COMPLETED"  # type: ignore[union-attr]
    slurm.advance(30)
    assert slurm.job(limited).state == "TIMEOUT"  # type: ignore[union-attr]
    slurm.advance(300)  # MinJobAge
    assert slurm.job(short) is None and slurm.jobs() == []
    victim = slurm.submit(job(nodes=("node1",)))
    slurm.set_down("node1")
    info = slurm.job(victim)
    assert info is not None and info.state == "PENDING" and slurm.restarts(victim) == 1
    assert states(slurm)["node1"] == "down"


def test_signals_are_recorded_and_kill_cancels() -> None:
    slurm = cluster(1)
    jid = slurm.submit(job(nodes=("node1",)))
    slurm.signal(jid, "usr1")
    assert slurm.job(jid).state == "RUNNING"  # type: ignore[union-attr]
    slurm.signal(jid, "SIGKILL")
    assert slurm.signals(jid) == ["USR1", "KILL"]
    assert slurm.job(jid).state == "CANCELLED"  # type: ignore[union-attr]
    with pytest.raises(SlurmError, match="completed"):
        slurm.cancel(jid)


def test_a_fleet_of_thousands_schedules_around_its_reservations() -> None:
    # The cost is measured by bench/memory_slurm.py; here: the same behaviour at scale.
    slurm = cluster(4000)
    for i in range(1, 401):
        slurm.create_reservation(f"guardctl_q_node{i}", [f"node{i}"], ["root"])
    ids = [slurm.submit(job(node_count=4)) for _ in range(901)]
    running = [slurm.job(j) for j in ids]
    assert sum(1 for r in running if r and r.state == "RUNNING") == 900  # 3600 free nodes
    assert all(int(n[4:]) > 400 for r in running if r for n in r.nodes)
    for jid in ids[:300]:
        slurm.finish(jid)
    slurm.advance(10)
    assert slurm.job(ids[-1]).state == "RUNNING"  # type: ignore[union-attr]
    assert len(slurm.nodes()) == 4000 and len(slurm.jobs()) == 901
