"""The real controller code over the in-memory Slurm: fast, and what a fleet simulation drives."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from controltools import fleet_trace

from guardctl.config import load_settings
from guardctl.controller.loop import Controller
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest

NODES = ["node1", "node2", "node3", "node4"]


def controller(tmp_path: Path, slurm: MemorySlurm, **control: object) -> Controller:
    settings = load_settings(environ={"GUARDCTL_STORE": str(tmp_path)})
    settings = dataclasses.replace(
        settings, control=dataclasses.replace(settings.control, **control))  # type: ignore[arg-type]
    return Controller(settings, act=True, slurm=slurm)


def decision(c: Controller, node: str) -> dict[str, object]:
    return next(d for d in c.run_pass().decisions if d["node"] == node)


def test_quarantine_wait_then_requeue_off_the_node(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    c = controller(tmp_path, slurm, requeue=True, checkpoint_interval_s=0.0, restart_s=0.0,
                   queue_wait_s=0.0)
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


def test_a_node_someone_else_took_out_comes_back_with_its_relapses_at_zero(tmp_path: Path
                                                                           ) -> None:
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


def test_a_node_merely_not_responding_keeps_its_relapses(tmp_path: Path) -> None:
    # After the Slurm controller restarts, nodes are "not responding" until their slurmd
    # registers: held by someone else for that moment, but not out for repair.
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm)
    c.ops.record("control sweep", ["node2"], reason="gemm ok", evidence={"verdict": "pass"})
    silent = dataclasses.replace(next(n for n in slurm.nodes() if n.name == "node2"),
                                 flags=frozenset({"NOT_RESPONDING"}))
    real_nodes = slurm.nodes
    slurm.nodes = lambda: [silent if n.name == "node2" else n for n in real_nodes()]  # type: ignore[method-assign]
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    assert decision(c, "node2")["decision"] == "leave"
    assert not [e for e in c.ops.log.entries() if e.action == "control fresh start"]
