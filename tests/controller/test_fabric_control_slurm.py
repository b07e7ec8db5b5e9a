"""A degraded leaf switch on the lab, whose Slurm knows the tree (topology/tree): guardctl
control names the leaf and takes no node action; with ``[control] fabric_quarantine`` it keeps
new jobs off the leaf's nodes (refused whole by the cap first), and releases them when the leaf
is healthy again; status, history and --explain say so. guardctl runs as a process."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from controltools import Trace, control_guardctl
from test_fabric_sweep_slurm import tree_lab

pytestmark = pytest.mark.slurm

NODES = [f"node{i}" for i in range(1, 7)]
LEAF = ["node4", "node5", "node6"]  # under s2 (tree_lab: s1 holds node1-3)


def telemetry(store: Path, *, degraded: bool) -> None:
    """A job on the six nodes, ending now; *degraded*: s2's nodes wait fifty times longer to
    send from the second minute. Written afresh."""
    tr = Trace(store, nodes=len(NODES), minutes=20, seed=7)
    tr.names = list(NODES)
    tr.t = tr.t - tr.t[-1] + time.time()
    if degraded:
        wait = np.diff(tr.nic["xmit_wait"], axis=0, prepend=tr.nic["xmit_wait"][:1])
        wait[tr.at(2) :, [tr.node(n) for n in LEAF], :] *= 50
        tr.nic["xmit_wait"] = np.cumsum(wait, 0)
    tr.write_afresh()


def reserved(lab: Any) -> str:
    return str(lab.sh("scontrol", "show", "-o", "reservation").stdout)


def test_a_degraded_leaf_on_the_lab_takes_no_node_action_until_asked(
    lab_factory: Callable[..., Any], tmp_path: Path
) -> None:
    lab = tree_lab(lab_factory, tmp_path)
    g = control_guardctl(tmp_path, lab)
    telemetry(g.store, degraded=True)

    proc = g("control", "--once", "--act", "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["topology"].startswith("slurm: 2 leaf switch(es)"), report["topology"]
    assert [(f["component"], f["nodes"]) for f in report["fabric"]] == [("leaf:s2", LEAF)]
    assert {d["node"]: d["decision"] for d in report["decisions"]} == dict.fromkeys(LEAF, "none")
    for node in NODES:
        assert "DRAIN" not in lab.node_state(node).get("state_flags", []), node
    assert "guardctl_" not in reserved(lab)

    status = json.loads(g("status", "--json").stdout)
    assert [f["component"] for f in status["fabric"]] == ["leaf:s2"]
    assert "control fabric" in g("history", "--control").stdout
    explain = g("control", "--explain", "leaf:s2").stdout
    assert "leaf:s2: open" in explain and "settle:" in explain, explain

    # Asked to keep jobs off them: three nodes are over the cap (safety.max_out_nodes = 2)...
    on = ("--set", "control.fabric_quarantine=true")
    refused = json.loads(g(*on, "control", "--once", "--act", "--json", timeout=300).stdout)
    assert refused["fabric"][0]["quarantine"]["outcome"].startswith("refused: cap"), refused
    assert "guardctl_" not in reserved(lab)
    # ...and within it, each gets guardctl's maintenance reservation.
    more = (*on, "--set", "safety.max_out_nodes=3")
    taken = json.loads(g(*more, "control", "--once", "--act", "--json", timeout=300).stdout)
    assert taken["fabric"][0]["quarantine"]["outcome"] == "done: 3 node(s) quarantined"
    assert all(f"guardctl_q_{n}" in reserved(lab) for n in LEAF), reserved(lab)
    assert "guardctl_q_node1" not in reserved(lab)

    telemetry(g.store, degraded=False)  # the switch repaired
    cleared = json.loads(g(*more, "control", "--once", "--act", "--json", timeout=300).stdout)
    assert cleared["fabric"] == []
    assert {(d["node"], d["decision"], d["outcome"]) for d in cleared["decisions"]} == {
        (n, "release", "done") for n in LEAF
    }
    assert "guardctl_" not in reserved(lab)
    log = json.loads(g("history", "--control", "--json").stdout)["entries"]
    phases = [e["evidence"]["phase"] for e in log if e["action"] == "control fabric"]
    assert phases == ["open", "quarantine", "quarantine", "cleared"], phases
