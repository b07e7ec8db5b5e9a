"""Qualification: nodes back from someone else's repair are swept before production work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sweeptools import make_guardctl

from guardctl.config import Layer, Settings, build_settings
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest
from guardctl.sweep.qualify import load_state, qualify


def settings(tmp_path: Path, **sweep: Any) -> Settings:
    return build_settings(
        [
            Layer(
                "t",
                {
                    "store": {"root": str(tmp_path / "store")},
                    "safety": {"max_out_fraction": 0.5},
                    "sweep": sweep,
                },
            )
        ]
    )


def test_a_node_back_from_repair_is_swept_before_use(tmp_path: Path) -> None:
    slurm = MemorySlurm([f"node{i}" for i in range(1, 7)])
    cfg = settings(tmp_path)
    ops = NodeOps(cfg, slurm)
    slurm.drain(["node3"], "ops: replacing GPU 5")
    first = qualify(cfg, ops=ops)
    assert first.returned == [] and first.sweep is None  # the first look only remembers
    assert load_state(cfg.store.root).held == ["node3"]
    slurm.resume(["node3"])  # the repair is done: node3 is back in service
    plan = qualify(cfg, ops=ops, dry_run=True, kind="single")
    assert plan.returned == ["node3"] and plan.sweep is not None
    assert [(a["node"], a["outcome"]) for a in plan.sweep.actions] == [("node3", "would do")]
    assert slurm.reservations() == []  # a dry run changes nothing, not even what it remembers
    assert load_state(cfg.store.root).held == ["node3"]


def test_a_sample_of_idle_healthy_nodes_is_due_by_age_and_stays_under_the_cap(
    tmp_path: Path,
) -> None:
    slurm = MemorySlurm([f"node{i}" for i in range(1, 9)])
    cfg = settings(tmp_path, qualify_sample=6)  # cap: min(16, 50% of 8) = 4
    slurm.submit(SubmitRequest("train.sbatch", nodes=("node1",)))  # busy: not sampled
    plan = qualify(cfg, ops=NodeOps(cfg, slurm), dry_run=True, kind="single")
    assert plan.sampled == ["node2", "node3", "node4", "node5"]
    assert plan.deferred == ["node6", "node7"]


def test_qualify_on_the_lab_sweeps_the_repaired_node_and_learns_from_it(
    lab: Any, tmp_path: Path
) -> None:
    g = make_guardctl(tmp_path, lab)
    lab.sh("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=ops: new DIMM")
    first = json.loads(g("qualify", "--json").stdout)
    assert first["returned"] == [] and first["sweep"] is None
    lab.sh("scontrol", "update", "NodeName=node2", "State=RESUME")
    lab.wait_idle(["node2"])
    proc = g("qualify", "--kind", "single", "--duration", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["returned"] == ["node2"]
    assert report["sweep"]["verdicts"][0]["node"] == "node2"
    assert report["sweep"]["verdicts"][0]["action"] == "released"
    assert report["sweep"]["baselines_learnt"]
    status = {n["node"]: n["guardctl"] for n in json.loads(g("status", "--json").stdout)["nodes"]}
    assert status["node2"] == "in service"
    again = json.loads(g("qualify", "--json").stdout)
    assert again["returned"] == [] and again["sweep"] is None  # qualified once
