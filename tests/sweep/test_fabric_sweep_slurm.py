"""A slow leaf switch on the lab: the pairwise sweep chooses partners by Slurm's topology/tree,
names the leaf, and drains no node (the slowdown is the sweep's lab-only fault injection)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sweeptools import make_guardctl

pytestmark = pytest.mark.slurm

# Two leaves under one spine: s1 holds node1-3, s2 node4-6.
TREE = (
    "SwitchName=s1 Nodes=node[1-3]\nSwitchName=s2 Nodes=node[4-6]\nSwitchName=s0 Switches=s[1-2]\n"
)


def tree_lab(lab_factory: Callable[..., Any], tmp_path: Path) -> Any:
    (tmp_path / "tree.conf").write_text("TopologyPlugin=topology/tree\n")
    (tmp_path / "topology.conf").write_text(TREE)
    args = [
        "--conf-extra",
        str(tmp_path / "tree.conf"),
        "--topology",
        str(tmp_path / "topology.conf"),
    ]
    return lab_factory(nodes=6, up_args=args)


def test_a_slow_leaf_is_named_and_no_node_is_drained(
    lab_factory: Callable[..., Any], tmp_path: Path
) -> None:
    lab = tree_lab(lab_factory, tmp_path)
    g = make_guardctl(tmp_path, lab, extra='inject = { "leaf:s2" = 0.1 }\n')
    proc = g("sweep", "node[4-5]", "--kind", "multi", "--duration", "3", "--json", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr + g.sweep_outputs()
    report = json.loads(proc.stdout)
    verdicts = {v["node"]: (v["verdict"], v["action"]) for v in report["verdicts"]}
    assert verdicts == {"node4": ("fabric", "released"), "node5": ("fabric", "released")}, report
    assert [f["component"] for f in report["fabric"]] == ["leaf:s2"], report["fabric"]
    finding = report["fabric"][0]
    assert finding["nodes"] == ["node4", "node5", "node6"]
    assert any("inside leaf s2" in line for line in finding["evidence_for"]), finding
    assert report["pairing"]["strategy"] == "by topology"
    assert report["pairing"]["topology"] == "slurm"
    # Partners from both leaves; every test that went through s2 was slow, none else.
    for rnd in report["pairing"]["history"]:
        for test in rnd:
            touches_s2 = any(n in ("node4", "node5", "node6") for n in test["nodes"])
            assert test["passed"] is (not touches_s2), report["pairing"]["history"]
    # Slurm: no node drained, nothing left reserved.
    for node in lab.nodes:
        assert "DRAIN" not in lab.node_state(node).get("state_flags", []), node
    assert "guardctl_" not in lab.sh("scontrol", "show", "-o", "reservation").stdout
    status = json.loads(g("status", "--json").stdout)
    assert {n["node"]: n["guardctl"] for n in status["nodes"]}["node4"] == "in service"


def test_a_slow_node_on_a_healthy_leaf_is_still_the_node(
    lab_factory: Callable[..., Any], tmp_path: Path
) -> None:
    lab = tree_lab(lab_factory, tmp_path)
    g = make_guardctl(tmp_path, lab, extra="inject = { node4 = 0.1 }\n")
    proc = g("sweep", "node4", "--kind", "multi", "--duration", "3", "--json", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr + g.sweep_outputs()
    report = json.loads(proc.stdout)
    assert [(v["node"], v["verdict"], v["action"]) for v in report["verdicts"]] == [
        ("node4", "fail", "drained")
    ], report
    assert report["fabric"] == []
    assert "DRAIN" in lab.node_state("node4")["state_flags"]
