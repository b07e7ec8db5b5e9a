"""The node-action rules, fast: NodeOps over the in-memory Slurm (the lab tests stay beside these).

Ownership, caps, the rate limit, observe-only, stale intents from another host, crash
reconciliation and sweep reservations, each checked against what Slurm shows afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from guardctl.actionlog import Entry
from guardctl.config import Layer, Settings, build_settings
from guardctl.errors import RefusedError
from guardctl.nodeops import NodeOps
from guardctl.nodeops.rules import check_rate
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest


def settings(tmp_path: Path, **safety: Any) -> Settings:
    table = {
        "store": {"root": str(tmp_path / "store")},
        "safety": {"max_out_fraction": 0.5, "max_out_nodes": 3, **safety},
    }
    return build_settings([Layer("test", table)])


def make(tmp_path: Path, nodes: int = 8, **safety: Any) -> tuple[NodeOps, MemorySlurm]:
    slurm = MemorySlurm([f"node{i}" for i in range(1, nodes + 1)])
    return NodeOps(settings(tmp_path, **safety), slurm), slurm


def owners(ops: NodeOps) -> dict[str, str]:
    return {s.name: s.owner for s in ops.status()}


def node(slurm: MemorySlurm, name: str) -> Any:
    return {n.name: n for n in slurm.nodes()}[name]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def forged(
    ops: NodeOps,
    action: str,
    phase: str,
    nodes: list[str],
    *,
    host: str,
    pid: int,
    age_s: float = 0.0,
    evidence: dict[str, Any] | None = None,
) -> Entry:
    """An entry as another guardctl process (dead, or on another host) would have written it."""
    return ops.log.append(
        Entry(
            uuid.uuid4().hex[:16],
            time.time() - age_s,
            action,
            phase,
            tuple(nodes),
            "ops@elsewhere",
            host,
            pid,
            "guardctl: x",
            dict(evidence or {}),
        )
    )


def test_someone_elses_drain_is_left_exactly_as_it_was(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)
    slurm.drain(["node1"], "admin: bad DIMM")
    slurm.drain(["node2"], "guardctl: typed by hand")  # the prefix alone does not make it ours
    before = [node(slurm, n) for n in ("node1", "node2")]
    for act in (
        lambda: ops.resume(["node1"]),
        lambda: ops.drain(["node1"], "slow"),
        lambda: ops.quarantine(["node1"]),
        lambda: ops.resume(["node2"]),
    ):
        with pytest.raises(RefusedError, match="held by someone else"):
            act()
    assert [node(slurm, n) for n in ("node1", "node2")] == before
    assert slurm.reservations() == []


def test_a_reason_rewritten_by_an_admin_is_theirs(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)
    ops.drain(["node3"], "slow")
    slurm.drain(["node3"], "admin: RMA")
    with pytest.raises(RefusedError):
        ops.resume(["node3"])
    assert node(slurm, "node3").reason == "admin: RMA"


def test_cap_refuses_the_whole_action(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)  # cap: min(3, 50% of 8) = 3
    ops.quarantine(["node1", "node2"])
    with pytest.raises(RefusedError, match="cap: guardctl would hold 4"):
        ops.drain(["node3", "node4"], "slow")
    assert not node(slurm, "node3").drained and not node(slurm, "node4").drained
    ops.drain(["node1", "node3"], "slow")  # node1 is held already: 3 in all
    assert owners(ops)["node1"] == owners(ops)["node3"] == "drained by guardctl"


def test_rate_limit_refuses_whole_and_forgets_after_an_hour(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path, max_actions_per_hour=3, max_out_nodes=8, max_out_fraction=1.0)
    ops.drain(["node1", "node2"], "slow")
    with pytest.raises(RefusedError, match="rate limit: 2 node action"):
        ops.drain(["node3", "node4"], "slow")
    assert not node(slurm, "node3").drained
    ops.drain(["node3"], "slow")  # exactly at the limit
    with pytest.raises(RefusedError, match="rate limit"):
        ops.resume(["node1"])
    check_rate(ops.settings.safety, ops.log.entries(), 3, now=time.time() + 3601)


def test_draining_a_quarantined_node_counts_one_action(tmp_path: Path) -> None:
    # The drain deletes the node's quarantine reservation too: one node action, as checked.
    ops, _slurm = make(tmp_path, max_actions_per_hour=3, max_out_nodes=8, max_out_fraction=1.0)
    ops.quarantine(["node1"], "suspect")
    ops.drain(["node1"], "swept: fail")
    assert [e.action for e in ops.log.entries() if e.phase == "done"] == [
        "quarantine",
        "drain",
        "release",
    ]
    ops.drain(["node2"], "slow")  # the third node action of the hour: at the limit
    with pytest.raises(RefusedError, match="rate limit: 3 node action"):
        ops.drain(["node3"], "slow")


def test_observe_only_changes_nothing_anywhere(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path, observe_only=True)
    for acted in (ops.drain(["node1"], "slow"), ops.quarantine(["node2"])):
        assert [a.outcome for a in acted] == ["would do"]
    with pytest.raises(RefusedError, match="observe_only"):
        ops.reserve_for_sweep(["node2", "node3"], "s1", "guardctl_s_s1_1")
    assert not node(slurm, "node1").drained and slurm.reservations() == []
    assert ops.log.entries() == []


def test_a_fresh_intent_from_another_host_is_left_alone_a_stale_one_closed(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)
    slurm.create_reservation("guardctl_q_node5", ["node5"], ["root"])
    fresh = forged(
        ops,
        "quarantine",
        "intent",
        ["node5"],
        host="other-host",
        pid=1,
        age_s=10,
        evidence={"reservation": "guardctl_q_node5"},
    )
    ops.reconcile()  # what every acting command does first
    assert not [e for e in ops.log.entries() if e.id == fresh.id and e.phase != "intent"]
    assert owners(ops)["node5"] == "held by someone else"  # in flight elsewhere: not ours yet
    forged(ops, "drain", "intent", ["node6"], host="other-host", pid=1, age_s=400)
    stale = forged(
        ops,
        "quarantine",
        "intent",
        ["node5"],
        host="other-host",
        pid=1,
        age_s=400,
        evidence={"reservation": "guardctl_q_node5"},
    )
    ops.reconcile()
    phases = {e.action: e.phase for e in ops.log.entries() if e.phase != "intent"}
    assert phases == {"drain": "abandoned", "quarantine": "reconciled"}
    assert owners(ops)["node5"] == "quarantined"
    assert stale.id in {e.id for e in ops.log.entries() if e.phase == "reconciled"}


def test_crash_after_slurm_is_reconciled_from_slurms_state(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)
    host, pid = socket.gethostname(), dead_pid()
    slurm.create_reservation("guardctl_q_node4", ["node4"], ["root"])
    forged(
        ops,
        "quarantine",
        "intent",
        ["node4"],
        host=host,
        pid=pid,
        evidence={"reservation": "guardctl_q_node4"},
    )
    forged(ops, "drain", "intent", ["node7"], host=host, pid=pid)  # scontrol never ran
    ops.reconcile()  # the next acting command
    assert owners(ops)["node4"] == "quarantined" and owners(ops)["node7"] == "in service"
    ops.release(["node4"])
    assert slurm.reservations() == []


def test_sweep_reservation_goes_through_the_door(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)  # at most 4 sweep partners at once
    ops.quarantine(["node1"])
    slurm.drain(["node8"], "admin: repair")
    with pytest.raises(RefusedError, match="node8: admin: repair"):
        ops.reserve_for_sweep(["node1", "node8"], "s1", "guardctl_s_s1_1")
    ops.reserve_for_sweep(["node2", "node3", "node4"], "s1", "guardctl_s_s1_1")
    with pytest.raises(RefusedError, match="cap: guardctl would hold 5 in-service node"):
        ops.reserve_for_sweep(["node1", "node5", "node6"], "s1", "guardctl_s_s1_3")
    ops.unreserve("guardctl_s_s1_1")
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1"]
    ops.reserve_for_sweep(["node1", "node2"], "s1", "guardctl_s_s1_2")
    status = {s.name: s for s in ops.status()}
    assert status["node1"].owner == "quarantined"
    assert status["node2"].owner == "held for a sweep"
    assert status["node2"].reservation == "guardctl_s_s1_2"
    intent = next(
        e
        for e in ops.log.entries()
        if e.action == "sweep reserve" and e.evidence["reservation"] == "guardctl_s_s1_2"
    )
    assert intent.phase == "intent" and intent.evidence["pid"] == os.getpid()
    assert intent.evidence["partners"] == ["node2"]
    ops.unreserve("guardctl_s_s1_2")
    assert owners(ops)["node2"] == "in service"
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1"]


def test_sweep_partners_count_against_the_rate_limit(tmp_path: Path) -> None:
    ops, _ = make(tmp_path, max_actions_per_hour=2, max_out_nodes=8, max_out_fraction=1.0)
    ops.quarantine(["node1"])
    with pytest.raises(RefusedError, match="rate limit"):
        ops.reserve_for_sweep(["node1", "node2", "node3"], "s1", "guardctl_s_s1_1")
    ops.reserve_for_sweep(["node1", "node2"], "s1", "guardctl_s_s1_1")


def test_a_dead_sweeps_reservation_is_deleted_by_the_next_command(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)
    ops.quarantine(["node1"])
    host, pid = socket.gethostname(), dead_pid()
    # The sweep created the reservation and submitted its job, then was killed (SIGKILL: no
    # outcome line, no cleanup).
    slurm.create_reservation("guardctl_s_s9_1", ["node1", "node2"], ["root"])
    job = slurm.submit(
        SubmitRequest("pairwise.sbatch", nodes=("node1", "node2"), reservation="guardctl_s_s9_1")
    )
    forged(
        ops,
        "sweep reserve",
        "intent",
        ["node1", "node2"],
        host=host,
        pid=pid,
        evidence={
            "sweep": "s9",
            "reservation": "guardctl_s_s9_1",
            "partners": ["node2"],
            "host": host,
            "pid": pid,
        },
    )
    ops.reconcile()  # the next acting command
    status = {s.name: s for s in ops.status()}
    assert status["node1"].owner == "quarantined" and status["node2"].owner == "in service"
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1"]
    assert slurm.job(job).state == "CANCELLED"  # type: ignore[union-attr]
    done = [(e.action, e.phase) for e in ops.log.entries()][-3:]
    assert done == [
        ("sweep reserve", "reconciled"),
        ("sweep unreserve", "intent"),
        ("sweep unreserve", "done"),
    ]


def test_a_live_sweeps_reservation_is_kept(tmp_path: Path) -> None:
    ops, slurm = make(tmp_path)
    ops.reserve_for_sweep(["node1", "node2"], "s1", "guardctl_s_s1_1")  # this process: alive
    other = NodeOps(ops.settings, slurm)
    assert owners(other)["node1"] == "held for a sweep"
    assert [r.name for r in slurm.reservations()] == ["guardctl_s_s1_1"]


@pytest.mark.parametrize(
    ("state", "flags", "want"),
    [
        ("mixed", {"REBOOT_REQUESTED"}, "held by someone else"),
        ("idle", {"REBOOT_ISSUED"}, "held by someone else"),
        ("idle", {"BLOCKED"}, "held by someone else"),
        ("idle", {"POWERED_DOWN"}, "held by someone else"),
        ("idle", {"NOT_RESPONDING"}, "held by someone else"),
        ("idle", {"A_FLAG_OF_A_NEWER_RELEASE"}, "held by someone else"),
        ("future", set(), "held by someone else"),
        ("unknown", set(), "held by someone else"),
        ("idle", {"PLANNED"}, "in service"),  # kept for a pending job: still at work
        ("allocated", {"COMPLETING"}, "in service"),
        ("idle", set(), "in service"),
    ],
)
def test_states_that_are_not_plainly_at_work_are_someone_elses(
    state: str, flags: set[str], want: str
) -> None:
    from guardctl.nodeops.ownership import Snapshot
    from guardctl.slurm.types import NodeInfo

    info = NodeInfo("node1", state, frozenset(flags), reason="firmware" if flags else "")
    owner, why = Snapshot({"node1": info}, []).owner("node1", "guardctl:")
    assert owner == want
    if want != "in service":
        assert info.slurm_state in why  # shown as Slurm reports it
