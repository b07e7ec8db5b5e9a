"""Node states beyond idle/drain/down, read live by guardctl's Slurm client on the lab's release:
shown as Slurm reports them, and never taken for a plain idle node that a sweep may use."""

from __future__ import annotations

import time
from typing import Any

import pytest
from labtools import lab_release

from guardctl.sections.slurm import SlurmSettings
from guardctl.slurm.cli_backend import CliSlurm
from guardctl.slurm.types import NodeInfo

pytestmark = pytest.mark.slurm


def client(lab: Any) -> CliSlurm:
    return CliSlurm(
        SlurmSettings(conf=str(lab.conf), bin_dir=str(lab.bin_dir or ""), timeout_s=20),
        environ=lab.env,
    )


def wait_node(lab: Any, name: str, want: str, timeout: float = 40) -> NodeInfo:
    """Poll guardctl's view of *name* until its flags or base state hold *want*."""
    deadline = time.monotonic() + timeout
    slurm = client(lab)
    while True:
        node = next(n for n in slurm.nodes() if n.name == name)
        if want in node.flags or node.state == want.lower():
            return node
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{name}: wanted {want}, have {node.slurm_state}")
        time.sleep(0.3)


def test_the_data_parser_is_pinned_where_the_release_has_it(lab: Any) -> None:
    slurm = client(lab)
    nodes = slurm.nodes()
    assert sorted(n.name for n in nodes) == lab.nodes
    # The release's newest data_parser: all its node states are in it.
    pinned = {(24, 11): "--json=v0.0.42", (26, 5): "--json=v0.0.45"}
    assert slurm.json_flag == pinned.get(slurm.version, "--json")
    assert {n.slurm_state for n in nodes} == {"idle"}


def test_planned_node_is_shown_and_not_idle(lab: Any, gctl: Any) -> None:
    # node1 is busy; a two-node job that needs it makes the backfill plan node2 for it.
    lab.submit("#!/bin/bash\nsleep 120\n", "-w", "node1", "--time=3")
    lab.wait_states({"node1": ("allocated", "mixed")})
    lab.submit("#!/bin/bash\ntrue\n", "-N2", "-w", "node1,node2", "--exclusive", "--time=3")
    node = wait_node(lab, "node2", "PLANNED")
    assert node.slurm_state != "idle" and "planned" in node.slurm_state
    assert not node.drained and not node.down
    # Kept by the backfill scheduler for a pending job: a node at work, and shown as such.
    shown = gctl.status()["node2"]
    assert "planned" in shown["slurm_state"] and shown["guardctl"] == "in service"


def test_reboot_requested_is_shown_and_not_idle(
    lab_factory: Any, gctl_factory: Any, tmp_path: Any
) -> None:
    extra = tmp_path / "reboot.conf"
    extra.write_text("RebootProgram=/bin/true\n")
    lab = lab_factory(nodes=2, up_args=["--conf-extra", str(extra)])
    # A reboot waits for the node's jobs: it stays requested while this one runs.
    lab.submit("#!/bin/bash\nsleep 120\n", "-w", "node1", "--time=3")
    lab.wait_states({"node1": ("allocated", "mixed")})
    lab.sh("scontrol", "reboot", "nextstate=resume", "reason=firmware", "node1")
    try:
        node = wait_node(lab, "node1", "REBOOT_REQUESTED")
        assert node.slurm_state.startswith(("mixed+", "allocated+"))
        assert "reboot_requested" in node.slurm_state
        # An operator's reboot has the node now: never in service for guardctl.
        gctl = gctl_factory(conf=str(lab.conf), env=lab.env, bin_dir=str(lab.bin_dir or ""))
        shown = gctl.status()["node1"]
        assert "reboot_requested" in shown["slurm_state"]
        assert shown["guardctl"] == "held by someone else", shown
        proc = gctl("quarantine", "node1", "--reason", "test")
        assert proc.returncode != 0 and "held by someone else" in proc.stderr
    finally:
        lab.sh("scontrol", "cancel_reboot", "node1", check=False)
        lab.cancel_all_jobs()


def test_blocked_is_shown_and_held(lab_factory: Any, gctl_factory: Any, tmp_path: Any) -> None:
    # topology/block (24.05+): an --exclusive=topo job leaves the rest of its block BLOCKED.
    # 24.11's JSON cannot show BLOCKED in any data_parser (v0.0.44 can): guardctl reads it
    # from scontrol's text there, and it must never read such a node as idle and in service.
    if tuple(int(p) for p in lab_release().split(".")) < (24, 5):
        pytest.skip(f"Slurm {lab_release()} has no topology/block (24.05+)")
    extra, topology = tmp_path / "block.conf", tmp_path / "topology.conf"
    extra.write_text("TopologyPlugin=topology/block\n")
    topology.write_text("BlockName=b1 Nodes=node[1-3]\nBlockSizes=3\n")
    lab = lab_factory(nodes=3, up_args=["--conf-extra", str(extra), "--topology", str(topology)])
    lab.submit("#!/bin/bash\nsleep 120\n", "-w", "node1", "--time=3", "--exclusive=topo")
    try:
        node = wait_node(lab, "node2", "BLOCKED")
        assert node.slurm_state == "idle+blocked"
        gctl = gctl_factory(conf=str(lab.conf), env=lab.env, bin_dir=str(lab.bin_dir or ""))
        shown = gctl.status()
        assert shown["node3"]["slurm_state"] == "idle+blocked"
        assert shown["node3"]["guardctl"] == "held by someone else", shown["node3"]
        proc = gctl("quarantine", "node2", "--reason", "test")
        assert proc.returncode == 6 and "held by someone else" in proc.stderr
    finally:
        lab.cancel_all_jobs()
