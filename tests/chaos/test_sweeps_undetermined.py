"""Sweep jobs that never measured (cancelled, NODE_FAIL, exit 127, pending until the timeout):
the node stays quarantined, its verdict is undetermined and says why, the sweep is retried
later and a bounded number of times; undetermined sweeps on several nodes are a fleet-wide
finding about the sweeps, never drains. And what lands between the controller's read and its
act (a user's job, an operator's quarantine) is never swept over, swept or released.

The real controller and sweep engine over the in-memory Slurm; each test asserts what Slurm
looks like afterwards and what the action log says."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from controltools import fleet_trace
from sweepchaos import (
    NODES,
    between_read_and_act,
    daemon,
    decision,
    drained,
    end_sweep_jobs,
    later,
    log,
    quarantined,
    settings,
    sweep_jobs,
    verdicts,
)

from guardctl.analyze.incremental import Analyzer
from guardctl.controller import loop
from guardctl.controller.loop import Controller
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import JobInfo, SubmitRequest
from guardctl.storage import layout
from guardctl.sweep.engine import SweepOptions, run_sweep
from guardctl.sweep.qualify import load_state, qualify


def started(
    tmp_path: Path, sweep: dict[str, Any] | None = None, **control: Any
) -> tuple[MemorySlurm, Controller]:
    """node2 flagged, quarantined and its sweep started by the first pass."""
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    c = daemon(tmp_path, slurm, sweep=sweep, **control)
    first = decision(c, "node2")
    assert (first["decision"], first["outcome"]) == ("quarantine", "sweep started"), first
    assert sweep_jobs(slurm, "node2")
    return slurm, c


def test_sweep_jobs_exiting_127_are_undetermined_retried_later_then_left_to_an_operator(
    tmp_path: Path,
) -> None:
    slurm, c = started(tmp_path)  # the defaults: retried after 600 s, at most 3 times
    ended = end_sweep_jobs(slurm, "node2", lambda j: slurm.finish(j, 127))  # no Python there
    assert len(ended) == 2  # gemm and nccl
    waits = decision(c, "node2")  # judged: undetermined; the retry waits for its time
    assert verdicts(c, "node2") == ["undetermined"]
    (judged,) = log(c, "control sweep", "node2")
    assert judged.reason.startswith("undetermined: sweep ") and "exit 127" in judged.reason
    assert judged.evidence["action"] == "kept quarantined"
    assert waits["decision"] == "wait" and "swept again after" in waits["why"], waits
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    assert not sweep_jobs(slurm, "node2")  # nothing started before its time
    later(c, undetermined_retry_s=0.0, max_undetermined=2)  # its time has come; 2 at most
    again = decision(c, "node2")
    assert (again["decision"], again["outcome"]) == ("sweep", "sweep started"), again
    end_sweep_jobs(slurm, "node2", lambda j: slurm.finish(j, 127))
    left = decision(c, "node2")
    assert verdicts(c, "node2") == ["undetermined", "undetermined"]
    assert left["decision"] == "hold off", left
    assert "control.max_undetermined=2" in left["why"] and "for an operator" in left["why"]
    assert "exit 127" in left["why"]
    decision(c, "node2")  # and it stays so: no third sweep
    assert not sweep_jobs(slurm, "node2")
    assert len(log(c, "control sweeping", "node2")) == 2
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    assert not log(c, "drain") and not log(c, "release")


def test_cancelled_sweep_jobs_are_undetermined_not_a_drain(tmp_path: Path) -> None:
    slurm, c = started(tmp_path)
    end_sweep_jobs(slurm, "node2", slurm.cancel)  # an operator's scancel, a preemption
    decision(c, "node2")
    assert verdicts(c, "node2") == ["undetermined"]
    assert "cancelled" in log(c, "control sweep", "node2")[0].reason
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    assert not log(c, "drain")


def test_a_sweep_job_ended_by_node_fail_is_undetermined(tmp_path: Path) -> None:
    slurm, c = started(tmp_path)
    slurm.set_down("node2", "Not responding")  # the running sweep job ends NODE_FAIL
    for job in sweep_jobs(slurm, "node2"):
        slurm.cancel(job.job_id)  # the one queued behind it
    decision(c, "node2")
    assert verdicts(c, "node2") == ["undetermined"]
    assert "node_fail" in log(c, "control sweep", "node2")[0].reason
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    slurm.resume(["node2"])  # back: still quarantined, its retry waits for its time
    back = decision(c, "node2")
    assert back["decision"] == "wait" and "swept again after" in back["why"], back
    assert not log(c, "drain") and not sweep_jobs(slurm, "node2")


def test_sweep_jobs_running_or_pending_until_the_timeout_are_undetermined(tmp_path: Path) -> None:
    slurm, c = started(tmp_path, sweep={"job_timeout_s": 0.3})
    jobs = {j.job_id: j.state for j in sweep_jobs(slurm, "node2")}
    assert sorted(jobs.values()) == ["PENDING", "RUNNING"]  # one job per node at a time
    time.sleep(0.4)  # the first never ends, the second never starts
    decision(c, "node2")
    assert {slurm.job(j).state for j in jobs} == {"CANCELLED"}  # type: ignore[union-attr]
    assert verdicts(c, "node2") == ["undetermined"]
    (judged,) = log(c, "control sweep", "node2")
    results = json.loads(
        (layout.sweep_dir(tmp_path, judged.evidence["sweep"]) / "results.json").read_text()
    )
    why = sorted(j["evidence"] for j in results["judgements"])
    assert all(j["undetermined"] and not j["passed"] for j in results["judgements"])
    assert (
        "job 1 timeout" in why[0]
        and "still pending (ReqNodeNotAvail) at sweep.job_timeout_s=0.3, cancelled" in why[1]
    ), why
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    assert not log(c, "drain")


def test_undetermined_sweeps_on_several_nodes_are_a_fleet_finding_not_drains(
    tmp_path: Path,
) -> None:
    slow = ["node2", "node3", "node4"]
    fleet_trace(tmp_path, NODES, slow={n: 1.3 for n in slow})
    slurm = MemorySlurm(NODES, start=time.time())
    # Three node faults, not a common cause (undetermined_fleet_nodes is 3 by default).
    c = daemon(tmp_path, slurm, max_fleet_fraction=1.0, max_job_fraction=1.0)
    first = c.run_pass()
    assert sorted(d["node"] for d in first.decisions if d["outcome"] == "sweep started") == slow
    for node in slow:  # the sweep program is missing on every node
        end_sweep_jobs(slurm, node, lambda j: slurm.finish(j, 127))
    held = {d["node"]: d for d in c.run_pass().decisions}
    for node in slow:
        assert verdicts(c, node) == ["undetermined"]
        assert held[node]["decision"] == "wait", held[node]
        assert "the sweep harness is broken" in held[node]["why"]
        assert quarantined(slurm, node) and not drained(slurm, node)
        assert not sweep_jobs(slurm, node)  # not retried while the sweeps are broken
    c.run_pass()
    (finding,) = log(c, "control fleet")
    assert finding.evidence["scope"] == "sweeps" and sorted(finding.nodes) == slow
    assert "measured nothing on 3 nodes" in finding.reason
    assert not log(c, "drain") and not log(c, "release")
    assert all(not sweep_jobs(slurm, n) for n in slow)


def test_a_job_landing_between_read_and_act_gets_no_sweep_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    c = daemon(tmp_path, slurm)
    landed: list[int] = []
    between_read_and_act(
        monkeypatch,
        lambda: landed.append(
            slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
        ),
    )
    first = decision(c, "node2")  # free at the read: quarantine, then a second look
    (job,) = landed
    assert first["decision"] == "quarantine" and first["outcome"].startswith("done; not swept")
    assert f"waiting for job(s) {job}" in first["outcome"], first
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    assert quarantined(slurm, "node2") and not sweep_jobs(slurm, "node2", live=False)
    assert not log(c, "control sweeping") and not log(c, "sweep started")
    slurm.finish(job)  # its job ends: now the sweep starts
    swept = decision(c, "node2")
    assert (swept["decision"], swept["outcome"]) == ("sweep", "sweep started"), swept
    assert len(log(c, "control sweeping", "node2")) == 1


def test_a_user_job_named_like_a_sweep_job_does_not_make_its_node_look_free(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("mine.sbatch", nodes=("node2",), job_name="guardctl-gemm"))
    c = daemon(tmp_path, slurm)
    first = decision(c, "node2")
    assert (first["decision"], first["outcome"], first["jobs"]) == ("quarantine", "done", [job])
    second = decision(c, "node2")
    assert second["decision"] == "wait" and f"waiting for job(s) {job}" in second["why"]
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    assert quarantined(slurm, "node2") and not sweep_jobs(slurm, "node2", live=False)
    assert not log(c, "control sweeping") and not log(c, "sweep jobs")


def test_sweep_jobs_are_recognised_by_their_logged_id_and_guardctl_reservation(
    tmp_path: Path,
) -> None:
    cfg = settings(tmp_path)
    slurm = MemorySlurm(NODES)
    ops = NodeOps(cfg, slurm)
    ops.quarantine(["node2"], "test")
    ours = slurm.submit(
        SubmitRequest(
            "gemm.sbatch", nodes=("node2",), job_name="anything", reservation="guardctl_q_node2"
        )
    )
    named = slurm.submit(SubmitRequest("x.sbatch", nodes=("node3",), job_name="guardctl-x"))
    ops.record(
        "sweep jobs",
        ["node2", "node3"],
        evidence={"sweep": "S", "jobs": {str(ours): "001-gemm-node2-a1", str(named): "forged"}},
    )
    # A job in guardctl's reservation but never logged by a sweep is someone else's too.
    stray = slurm.submit(
        SubmitRequest("y.sbatch", job_name="guardctl-y", reservation="guardctl_q_node2")
    )
    jobs: list[JobInfo] = slurm.jobs()
    assert loop.own_sweep_jobs(cfg, ops.log.entries(), jobs) == frozenset({ours})
    assert stray not in loop.own_sweep_jobs(cfg, ops.log.entries(), jobs)


def test_an_operator_quarantine_between_read_and_act_is_neither_swept_nor_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    c = daemon(tmp_path, slurm)
    operator = NodeOps(c.settings, slurm)
    between_read_and_act(monkeypatch, lambda: operator.quarantine(["node2"], "ops: checking"))
    first = decision(c, "node2")
    assert first["decision"] == "quarantine", first
    assert first["outcome"].startswith("no change: already quarantined"), first
    assert quarantined(slurm, "node2") and not sweep_jobs(slurm, "node2", live=False)
    second = decision(c, "node2")
    assert second["decision"] == "leave", second
    assert quarantined(slurm, "node2") and not sweep_jobs(slurm, "node2", live=False)
    (taken,) = [e for e in log(c, "quarantine") if e.phase == "done"]
    assert "ops: checking" in taken.reason and taken.evidence.get("by") != "control"
    assert not log(c, "control sweeping") and not log(c, "sweep started")
    assert not log(c, "release") and not log(c, "drain")


def test_during_a_fleet_wide_finding_sweeps_of_quarantined_nodes_are_held(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    c = daemon(tmp_path, slurm)
    first = decision(c, "node2")
    assert (first["decision"], first["outcome"]) == ("quarantine", "done"), first
    slurm.finish(job)  # free now: it would be swept at the next pass
    # A fleet-wide thermal event: half the fleet reports hardware slowdown at once.
    fleet_trace(
        tmp_path,
        NODES,
        hw_slowdown=["node1", "node3", "node5", "node7"],
        slow={"node2": 1.3},
        replace=True,
    )
    c.analyzer = Analyzer(c.settings)  # the telemetry rewritten: read it afresh
    report = c.run_pass()
    assert any("node2" in f["nodes"] for f in report.fleet), report.fleet
    held = next(d for d in report.decisions if d["node"] == "node2")
    assert held["decision"] == "wait", held
    assert "sweep held during a fleet-wide finding" in held["why"]
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    assert not sweep_jobs(slurm, "node2", live=False)
    assert not log(c, "control sweeping") and not log(c, "drain")


def test_a_one_off_sweep_pending_behind_a_job_until_the_timeout_drains_nothing(
    tmp_path: Path,
) -> None:
    cfg = settings(tmp_path, sweep={"job_timeout_s": 0.3})
    slurm = MemorySlurm(NODES)
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    ops = NodeOps(cfg, slurm)
    report = run_sweep(cfg, ["node2"], SweepOptions(kind="single", duration_s=1.0), ops=ops)
    (verdict,) = report.verdicts
    assert (verdict.verdict, verdict.action) == ("undetermined", "kept quarantined")
    assert "still pending (ReqNodeNotAvail)" in verdict.evidence, verdict.evidence
    assert report.failed  # exit 1: an operator must look
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    assert not [e for e in ops.log.entries() if e.action == "drain"]
    (judged,) = [e for e in ops.log.entries() if e.action == "sweep judged"]
    assert judged.evidence["verdicts"] == {"node2": "undetermined"}


def test_a_qualification_sweep_that_measured_nothing_drains_nothing(tmp_path: Path) -> None:
    # MemorySlurm's jobs run until ended: these run to sweep.job_timeout_s, with no output.
    cfg = settings(tmp_path, sweep={"job_timeout_s": 0.3, "qualify_sample": 1})
    slurm = MemorySlurm(NODES)
    report = qualify(cfg, ops=NodeOps(cfg, slurm), kind="single", duration_s=1.0)
    assert report.sampled == ["node1"] and report.sweep is not None
    (verdict,) = report.sweep.verdicts
    assert (verdict.verdict, verdict.action) == ("undetermined", "kept quarantined")
    assert quarantined(slurm, "node1") and not drained(slurm, "node1")
    assert "node1" not in load_state(cfg.store.root).last_swept  # not counted as qualified
