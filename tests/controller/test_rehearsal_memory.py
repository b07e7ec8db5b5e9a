"""Observe-only walks the ladder on paper: over the in-memory Slurm, nothing changes in Slurm,
and the action log says what the controller would have done, rung by rung."""

from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner
from controltools import fleet_trace
from test_control_memory import NODES, controller

from guardctl.actionlog import ActionLog
from guardctl.cli import main
from guardctl.controller.ladder import REHEARSAL, derive
from guardctl.controller.loop import counts_toward_cap
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest


def paper(root: Path) -> list[tuple[str, str]]:
    return [
        (str(e.evidence["step"]), e.reason)
        for e in ActionLog(root).entries()
        if e.action == REHEARSAL
    ]


def unchanged(slurm: MemorySlurm) -> None:
    assert slurm.reservations() == []
    assert not any(n.drained for n in slurm.nodes())


def test_observe_only_walks_quarantine_then_sweep_on_paper(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    c = controller(tmp_path, slurm)
    c.acting = False  # observe-only

    first = next(d for d in c.run_pass().decisions if d["node"] == "node2")
    assert (first["decision"], first["outcome"]) == ("quarantine", "would do")
    assert [s for s, _ in paper(tmp_path)] == ["quarantine"]
    unchanged(slurm)

    waiting = next(d for d in c.run_pass().decisions if d["node"] == "node2")
    assert (waiting["decision"], waiting["rung"]) == ("wait", "b"), waiting  # on paper
    assert [s for s, _ in paper(tmp_path)] == ["quarantine"]  # nothing new to say
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]

    slurm.finish(job)  # the job ends: on paper the node is free for its sweep
    swept = next(d for d in c.run_pass().decisions if d["node"] == "node2")
    assert swept["decision"] == "sweep", swept
    steps = paper(tmp_path)
    assert [s for s, _ in steps] == ["quarantine", "sweep"]
    assert "would sweep when free; the verdict decides drain or release" in steps[1][1]
    c.run_pass()  # flagged on the same data: nothing more on paper
    assert [s for s, _ in paper(tmp_path)] == ["quarantine", "sweep"]
    unchanged(slurm)

    entries = ActionLog(tmp_path).entries()
    assert not [e for e in entries if e.phase != "note"]  # no intent, no node action
    assert not any(counts_toward_cap(e) for e in entries)
    ladder = derive(entries)["node2"]
    assert not ladder.quarantined_by_control and ladder.quarantined_at is None
    assert ladder.sweeps == [] and ladder.rehearsal["step"] == "sweep"
    snap = NodeOps(c.settings, slurm).snapshot()
    assert snap.owner("node2", c.settings.quarantine.reservation_prefix)[0] == "in service"
    shown = CliRunner().invoke(
        main, ["history", "--control"], env={"GUARDCTL_STORE": str(tmp_path)}
    )
    assert shown.exit_code == 0, shown.output
    notes = [line for line in shown.output.splitlines() if REHEARSAL in line]
    assert len(notes) == 2 and "would quarantine node2" in notes[0]
    assert "would sweep when free" in notes[1]


def test_an_acting_controller_ignores_the_paper_ladder(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    c = controller(tmp_path, slurm)
    c.acting = False
    c.run_pass()  # quarantined on paper
    c.acting = True
    d = next(d for d in c.run_pass().decisions if d["node"] == "node2")
    assert (d["decision"], d["outcome"]) == ("quarantine", "done"), d  # the real rung b
    assert "node2" in slurm.reservations()[0].nodes
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]


def test_observe_only_would_requeue_by_the_ski_rental_rule_on_paper(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    c = controller(
        tmp_path, slurm, requeue=True, checkpoint_interval_s=0.0, restart_s=0.0, queue_wait_s=0.0
    )
    c.acting = False
    c.run_pass()
    second = next(d for d in c.run_pass().decisions if d["node"] == "node2")
    assert (second["decision"], second["outcome"]) == ("requeue", "would do"), second
    c.run_pass()  # the same job, the same paper step: noted once
    steps = paper(tmp_path)
    assert [s for s, _ in steps] == ["quarantine", "requeue"]
    assert f"would requeue job {job} off node2" in steps[1][1]
    assert slurm.restarts(job) == 0 and slurm.excluded(job) == frozenset()
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    unchanged(slurm)
