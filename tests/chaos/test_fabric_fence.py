"""A leader deposed in the middle of a pass writes no fabric quarantine: keeping new jobs off a
faulty switch's nodes (``[control] fabric_quarantine``) is fenced by the lease like every change
the controller makes, and the new leader takes it over."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from test_fabric_control import LEAF, TREE, telemetry
from test_lease_fencing import LEASE, HostClock, controller

from guardctl.controller.lease import LeaseLost
from guardctl.slurm.memory import MemorySlurm


def test_a_deposed_leader_writes_no_fabric_quarantine(tmp_path: Path) -> None:
    telemetry(tmp_path)
    slurm = MemorySlurm([f"node{i}" for i in range(1, 9)], start=time.time())
    slurm.tree = TREE
    ca, cb = HostClock("a"), HostClock("b")
    a, b = controller(tmp_path, slurm, ca), controller(tmp_path, slurm, cb)
    first = a.run_pass()  # the leaf found and noted; no quarantine asked for yet
    assert [f["component"] for f in first.fabric] == ["leaf:s1"]
    assert slurm.reservations() == []
    assert not b.run_pass().leader
    a.cfg = dataclasses.replace(a.cfg, fabric_quarantine=True)  # A would keep jobs off them

    real_analysis = a.analysis
    seen: dict[str, object] = {}

    def stopped_here():  # type: ignore[no-untyped-def]
        got = real_analysis()
        assert not b.run_pass().leader  # B sees A's renewal of this pass
        ca.passed += LEASE + 5  # A is stopped past its lease...
        cb.passed += LEASE + 5  # ...and B, seeing no renewal, takes over
        assert b.run_pass().leader
        seen["entries"] = len(a.ops.log.entries())
        return got

    a.analysis = stopped_here  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        a.run_pass()  # A wakes with the leaf's nodes to quarantine: its first change is fenced
    assert slurm.reservations() == []
    assert len(a.ops.log.entries()) == seen["entries"]  # not even an intent from A
    assert not [e for e in a.ops.log.entries() if e.action == "quarantine"]
    a.analysis = real_analysis  # type: ignore[method-assign]
    assert not a.run_pass().leader and slurm.reservations() == []

    b.cfg = dataclasses.replace(b.cfg, fabric_quarantine=True)  # the leader's own choice
    b.run_pass()
    assert {n for r in slurm.reservations() for n in r.nodes} == set(LEAF)
