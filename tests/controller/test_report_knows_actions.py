"""The report says what guardctl did about each finding (from the action log), never asks an
operator to drain a node the controller already swept and released, and shows observe-only's
week of what the controller would have done."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner
from controltools import fleet_trace
from test_control_memory import NODES, controller

from guardctl.actionlog import ActionLog
from guardctl.cli import main
from guardctl.config import load_settings
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest

IMPACT = {"job": "40117", "pct": 14.0, "gpu_h_per_day": 860.0, "gpus": 8}


def report(store: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(
        main,
        ["report", "--input", str(store), "--period", "30m", *args],
        env={"GUARDCTL_STORE": str(store)},
    )
    return res.exit_code, res.output


def row(text: str, node: str) -> str:
    act = text.split("## Act on these")[1].split("\n## ")[0]
    return next(line for line in act.splitlines() if line.startswith(f"| {node} |"))


def test_a_node_the_controller_swept_and_released_is_not_left_to_an_operator(
    tmp_path: Path,
) -> None:
    fleet_trace(tmp_path, NODES, slow={"node3": 1.3})
    code, before = report(tmp_path)
    assert code == 1 and "sweep it (guardctl sweep)" in row(before, "node3")  # nobody acted

    slurm = MemorySlurm(NODES, start=time.time())
    ops = NodeOps(load_settings(environ={"GUARDCTL_STORE": str(tmp_path)}), slurm)
    ops.quarantine(
        ["node3"], "control: persistent node fault", evidence={"by": "control", "impact": IMPACT}
    )
    ops.release(["node3"], evidence={"sweep": "sw1"})  # the sweep's verdict, through the door
    ops.record(
        "control sweep",
        ["node3"],
        reason="gemm at its baseline",
        evidence={"verdict": "pass", "action": "released", "sweep": "sw1"},
    )
    assert slurm.reservations() == []  # released: the node is back in production
    released = next(
        e for e in ActionLog(tmp_path).entries() if e.action == "release" and e.phase == "done"
    )

    code, text = report(tmp_path)
    assert code == 0, text  # nothing left to an operator
    node3 = row(text, "node3")
    assert "drain" not in node3.lower()
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(released.ts))
    assert f"swept: pass, released at {when}" in node3
    assert "none: swept and released" in node3
    assert "Kept off jobs by guardctl's quarantines (est.)" in text
    assert "Slower than their peers now**: 1 node(s); guardctl handles 1, 0 left" in text

    code, raw = report(tmp_path, "--format", "json")
    data = json.loads(raw)
    assert data["guardctl_did"]["node3"]["state"] == "released"
    steps = data["guardctl_did"]["node3"]["steps"]
    assert len(steps) == 2 and steps[0].startswith("quarantined at ")
    assert steps[1] == f"swept: pass, released at {when}"
    assert data["fleet"]["Kept off jobs by guardctl's quarantines (est.)"].endswith(
        "GPU-h of slowdown since each quarantine"
    )


def test_the_report_shows_observe_onlys_week_of_what_it_would_have_done(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    c = controller(tmp_path, slurm)
    c.acting = False
    c.run_pass()
    slurm.finish(job)
    c.run_pass()
    assert slurm.reservations() == [] and not any(n.drained for n in slurm.nodes())
    _, text = report(tmp_path)
    paper = text.split("## What guardctl would have done (observe-only)")[1].split("\n## ")[0]
    steps = [
        line.split(" | ")[2]
        for line in paper.splitlines()
        if line.startswith("| 20") and "node2" in line
    ]
    assert steps == ["quarantine", "sweep"], paper
    assert "would sweep when free; the verdict decides drain or release" in paper
    assert "Would have kept off jobs (observe-only, est.)" in text
    assert "nothing yet" in row(text, "node2")  # on paper only: guardctl did nothing
