"""The real controller code over the in-memory Slurm: fast, and what a fleet simulation drives."""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from pathlib import Path

from controltools import ShardedTrace, fleet_trace

from guardctl.config import load_settings
from guardctl.controller.loop import Controller
from guardctl.limits import CONTROLLER_OPEN_FILES
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest
from guardctl.storage import layout

NODES = ["node1", "node2", "node3", "node4"]


def controller(tmp_path: Path, slurm: MemorySlurm, **control: object) -> Controller:
    settings = load_settings(environ={"GUARDCTL_STORE": str(tmp_path)})
    settings = dataclasses.replace(
        settings, control=dataclasses.replace(settings.control, **control)
    )  # type: ignore[arg-type]
    return Controller(settings, act=True, slurm=slurm)


def decision(c: Controller, node: str) -> dict[str, object]:
    return next(d for d in c.run_pass().decisions if d["node"] == node)


def test_quarantine_wait_then_requeue_off_the_node(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    c = controller(
        tmp_path, slurm, requeue=True, checkpoint_interval_s=0.0, restart_s=0.0, queue_wait_s=0.0
    )
    first = decision(c, "node2")
    assert (first["decision"], first["outcome"]) == ("quarantine", "done")
    assert "node2" in slurm.reservations()[0].nodes
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    second = decision(c, "node2")
    assert (second["decision"], second["outcome"]) == ("requeue", "done")
    assert slurm.restarts(job) == 1 and slurm.excluded(job) == frozenset({"node2"})


def test_observe_only_leaves_the_memory_slurm_as_it_was(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm)
    c.acting = False
    report = c.run_pass()
    (d,) = report.decisions
    assert (d["decision"], d["outcome"]) == ("quarantine", "would do")
    assert slurm.reservations() == [] and not any(n.drained for n in slurm.nodes())


def test_a_node_someone_else_took_out_comes_back_with_its_relapses_at_zero(tmp_path: Path) -> None:
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm)
    for _ in range(2):  # two passed sweeps: the next flag would make it a lemon
        c.ops.record("control sweep", ["node2"], reason="gemm ok", evidence={"verdict": "pass"})
    slurm.drain(["node2"], "ops: replaced GPU 3")  # an administrator's repair
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    held = decision(c, "node2")
    assert held["decision"] == "leave"
    starts = [e for e in c.ops.log.entries() if e.action == "control fresh start"]
    assert [e.nodes for e in starts] == [("node2",)] and "replaced GPU 3" in starts[0].reason
    c.run_pass()  # recorded once, not every pass
    assert len([e for e in c.ops.log.entries() if e.action == "control fresh start"]) == 1
    slurm.resume(["node2"])
    slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)  # a job on it: the quarantine waits for it instead of sweeping now
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    back = decision(c, "node2")
    assert (back["decision"], back["rung"], back["relapse"]) == ("quarantine", "b", 0), back


def test_a_node_guardctl_drained_comes_back_from_repair_with_its_relapses_at_zero(
    tmp_path: Path,
) -> None:
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm)
    for _ in range(2):  # two passed sweeps: the next flag would make it a lemon
        c.ops.record("control sweep", ["node2"], reason="gemm ok", evidence={"verdict": "pass"})
    c.ops.drain(["node2"], "sweep gemm below its baseline")  # guardctl's own drain
    slurm.resume(["node2"])  # repaired, and returned by the administrator
    slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    back = decision(c, "node2")
    # Not drained as a lemon on passes from before its repair: the ladder from the start.
    assert (back["decision"], back["rung"], back["relapse"]) == ("quarantine", "b", 0), back


def test_a_node_merely_not_responding_keeps_its_relapses(tmp_path: Path) -> None:
    # After the Slurm controller restarts, nodes are "not responding" until their slurmd
    # registers: held by someone else for that moment, but not out for repair.
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm)
    c.ops.record("control sweep", ["node2"], reason="gemm ok", evidence={"verdict": "pass"})
    silent = dataclasses.replace(
        next(n for n in slurm.nodes() if n.name == "node2"), flags=frozenset({"NOT_RESPONDING"})
    )
    real_nodes = slurm.nodes
    slurm.nodes = lambda: [silent if n.name == "node2" else n for n in real_nodes()]  # type: ignore[method-assign]
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    assert decision(c, "node2")["decision"] == "leave"
    assert not [e for e in c.ops.log.entries() if e.action == "control fresh start"]


# Rung a: a job the data-sharding service serves. The first trace ends 5 min ago (one window),
# the later one now, so a later pass judges a window wholly after rung a was taken.


def rung_a_taken(tmp_path: Path, **control: object) -> tuple[Controller, MemorySlurm, int, float]:
    now = time.time()
    slurm = MemorySlurm(NODES, start=now)
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=tuple(NODES), job_name="train"))
    slurm.advance(1)
    layout.dds_dir(tmp_path, str(job)).mkdir(parents=True)  # the job's service runs
    ShardedTrace(
        tmp_path, NODES, str(job), slow="node2", factor=1.5, minutes=20, end=now - 300
    ).write()
    c = controller(tmp_path, slurm, **control)
    first = decision(c, "node2")
    assert (first["decision"], first["rung"], first["outcome"]) == ("rebalance", "a", ""), first
    watch = first["rebalance"]
    assert watch["phase"] == "watch"  # type: ignore[index]
    assert 13.4 < watch["step_s"] < 13.8 and 9.9 < watch["step_s_without"] < 10.3  # type: ignore[index]
    assert slurm.reservations() == []  # nothing done to the node: the service moves the work
    return c, slurm, job, now


def later_steps(tmp_path: Path, job: int, now: float, rebalanced: float | None) -> None:
    """Five more minutes of the job, ending now (*rebalanced*: the minute shares moved)."""
    ShardedTrace(
        tmp_path,
        NODES,
        str(job),
        slow="node2",
        factor=1.5,
        minutes=25,
        end=now,
        rebalanced=rebalanced,
    ).write()


def watches(c: Controller) -> list[str]:
    return [
        str(e.evidence["phase"]) for e in c.ops.log.entries() if e.action == "control rebalance"
    ]


def test_rung_a_a_rebalanced_job_whose_step_time_recovers_stays_on_rung_a(tmp_path: Path) -> None:
    c, slurm, job, now = rung_a_taken(tmp_path)
    later_steps(tmp_path, job, now, rebalanced=20)
    second = decision(c, "node2")
    assert (second["decision"], second["rung"]) == ("rebalance", "a"), second
    watch = second["rebalance"]
    assert watch["phase"] == "recovered" and watch["step_s_now"] < 10.3  # type: ignore[index]
    assert watch["won_back_pct"] > 90, watch  # type: ignore[index]
    assert "recovered: 13.6" in str(second["why"]) or "recovered: 13.5" in str(second["why"])
    assert slurm.reservations() == [] and slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    c.run_pass()
    assert watches(c) == ["watch", "recovered"]  # each once, with its figures
    explained = c.explain("node2")
    assert explained["ladder"]["rebalance"]["phase"] == "recovered"


def test_rung_a_a_step_time_that_does_not_recover_in_time_goes_on_to_quarantine(
    tmp_path: Path,
) -> None:
    c, slurm, job, now = rung_a_taken(tmp_path, rebalance_window_s=600.0)
    later_steps(tmp_path, job, now, rebalanced=None)  # shares never moved
    second = decision(c, "node2")
    assert (second["decision"], second["rung"]) == ("rebalance", "a"), second  # still in time
    assert second["rebalance"]["step_s_now"] > 13.4  # type: ignore[index]
    assert slurm.reservations() == []
    c.cfg = dataclasses.replace(c.cfg, rebalance_window_s=0.0)  # its time is up
    third = decision(c, "node2")
    assert (third["decision"], third["rung"], third["outcome"]) == ("quarantine", "b", "done")
    assert "did not recover within 0 s" in str(third["why"]), third
    assert "node2" in slurm.reservations()[0].nodes
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    assert watches(c) == ["watch", "not recovered"]
    (taken,) = [e for e in c.ops.log.entries() if e.action == "quarantine" and e.phase == "done"]
    assert taken.evidence["rebalance"]["phase"] == "not recovered"
    assert taken.evidence["rebalance"]["step_s_now"] > 13.4


def test_rung_a_without_newer_step_records_waits_then_goes_on(tmp_path: Path) -> None:
    c, slurm, _job, _now = rung_a_taken(tmp_path)
    second = decision(c, "node2")  # the same records: nothing to compare
    assert (second["decision"], second["rung"]) == ("rebalance", "a"), second
    assert "step_s_now" not in second["rebalance"]  # type: ignore[operator]
    assert watches(c) == ["watch"] and slurm.reservations() == []
    c.cfg = dataclasses.replace(c.cfg, rebalance_window_s=0.0)
    third = decision(c, "node2")
    assert (third["decision"], third["outcome"]) == ("quarantine", "done"), third
    assert "no newer step records of the job" in str(third["why"])
    assert watches(c) == ["watch", "not recovered"]


def test_a_sweep_open_in_the_log_that_no_daemon_here_runs_is_aborted_once(tmp_path: Path) -> None:
    # What a daemon SIGKILLed mid-sweep leaves: its sweep started, a batch submitted, no verdict.
    fleet_trace(tmp_path, NODES)
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(
        SubmitRequest("gemm.sbatch", nodes=("node2",), job_name="guardctl-sweep-gemm")
    )
    slurm.advance(1)
    c = controller(tmp_path, slurm)
    c.ops.record(
        "control sweeping",
        ["node2"],
        reason="sweep S1 started",
        evidence={"by": "control", "sweep": "S1"},
    )
    c.ops.record(
        "sweep jobs", ["node2"], evidence={"sweep": "S1", "jobs": {str(job): "001-gemm-node2-a1"}}
    )
    c.acting = False
    c.run_pass()  # observing only: not even a dead daemon's sweep job is cancelled
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    c.acting = True
    c.run_pass()
    assert slurm.job(job).state == "CANCELLED"  # type: ignore[union-attr]
    c.run_pass()  # closed in the log: aborted once
    closed = [e for e in c.ops.log.entries() if e.action == "control sweep"]
    assert [(e.evidence["verdict"], e.evidence["sweep"]) for e in closed] == [("aborted", "S1")]
    assert "no longer runs it" in closed[0].reason
    assert [e.action for e in c.ops.log.entries() if e.action == "sweep aborted"] == [
        "sweep aborted"
    ]


def test_a_daemon_judges_windows_ending_on_its_interval_and_one_pass_the_newest(
    tmp_path: Path,
) -> None:
    """So that a window judged once is judged again unchanged a window length later (the
    analyzer then keeps its figures), a daemon's windows end on the newest multiple of its
    pass interval. A single pass keeps nothing, so it judges up to the newest record: on the
    minute, data written since would wait for the next run (a relapse seen late)."""
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    newest = controller(tmp_path, slurm).analysis().window_end  # one pass: the newest record
    assert newest % 60 and newest % 7
    for interval, align, want in (
        (60.0, True, newest // 60 * 60),
        (7.0, True, newest // 7 * 7),
        (60.0, False, newest),
    ):
        c = controller(tmp_path, slurm, align=align)
        c.as_daemon(interval)
        assert c.analysis().window_end == want


def test_a_daemon_raises_its_open_files_limit_for_the_mirrors_its_analyzer_keeps_open(
    tmp_path: Path,
) -> None:
    """A daemon started by hand, not by the unit (LimitNOFILE), would find the common soft
    limit of 1024: its analyzer, keeping mirrors open within a quarter of it, would open most
    of a large fleet's files every pass. It raises its soft limit, within the hard one."""
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # never below what this test process holds open (a long run may hold more than 1024)
    inherited = max(min(1024, hard), len(os.listdir("/proc/self/fd")) + 64)
    resource.setrlimit(resource.RLIMIT_NOFILE, (inherited, hard))
    try:
        c = controller(tmp_path, MemorySlurm(NODES, start=time.time()))
        c.as_daemon(60.0)
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)
        c.analysis()
        room = c.analyzer._fd_room
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))
    want = CONTROLLER_OPEN_FILES
    want = want if hard == resource.RLIM_INFINITY else min(want, hard)
    assert raised == (max(inherited, want), hard)
    # its analyzer's room to keep files open: a quarter of the raised limit
    kept = sum(st.fd >= 0 for st in c.analyzer._files.values())
    assert room is not None and room + kept == raised[0] // 4
