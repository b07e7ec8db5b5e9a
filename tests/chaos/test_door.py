"""The node-action door when slurmctld answers late or not at all, when an outcome line is lost,
when a drain cannot give its quarantine back, and when guardctl only observes or reads.

Over the in-memory Slurm; each test asserts what Slurm shows afterwards and what the log says.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from controltools import fleet_trace

from guardctl.actionlog import ActionLog, Entry
from guardctl.config import Layer, Settings, build_settings, load_settings
from guardctl.controller.loop import Controller
from guardctl.errors import RefusedError, SlurmError, SlurmUnavailable, StoreError
from guardctl.nodeops import NodeOps
from guardctl.nodeops.ownership import NODE_ACTIONS
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest

NODES = [f"node{i}" for i in range(1, 9)]


class LateSlurm(MemorySlurm):
    """slurmctld makes the change, and its answer is lost: the client times out."""

    late: frozenset[str] = frozenset()
    silent: frozenset[str] = frozenset()

    def _answer(self, name: str) -> None:
        if name in self.silent:
            raise SlurmUnavailable(f"scontrol {name}: did not finish within 30 s")

    def _late(self, name: str) -> None:
        if name in self.late:
            raise SlurmUnavailable(f"scontrol {name}: did not finish within 30 s")

    def create_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        users: Sequence[str],
        flags: Sequence[str] = ("MAINT", "IGNORE_JOBS"),
    ) -> None:
        self._answer("create_reservation")
        super().create_reservation(name, nodes, users, flags)
        self._late("create_reservation")

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        self._answer("drain")
        super().drain(nodes, reason)
        self._late("drain")


def settings(tmp_path: Path, **safety: Any) -> Settings:
    table = {
        "store": {"root": str(tmp_path / "store")},
        "safety": {"max_out_fraction": 1.0, "max_out_nodes": 4, **safety},
    }
    return build_settings([Layer("test", table)])


def owners(ops: NodeOps) -> dict[str, str]:
    return {s.name: s.owner for s in ops.status()}


def phases(ops: NodeOps, action: str) -> list[str]:
    return [e.phase for e in ActionLog(ops.log.path.parents[1]).entries() if e.action == action]


def test_a_quarantine_slurm_made_but_answered_late_stays_guardctls(tmp_path: Path) -> None:
    slurm = LateSlurm(NODES)
    slurm.late = frozenset({"create_reservation"})
    ops = NodeOps(settings(tmp_path), slurm)
    with pytest.raises(SlurmUnavailable):
        ops.quarantine(["node1"], "slow")
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1"]
    assert phases(ops, "quarantine") == ["intent"]  # open, not "failed": Slurm may have done it
    slurm.late = frozenset()
    ops.quarantine(["node2"], "slow")  # the next acting command settles it from Slurm's state
    assert phases(ops, "quarantine") == ["intent", "reconciled", "intent", "done"]
    assert owners(ops)["node1"] == "quarantined"
    ops.release(["node1"])  # guardctl's own again: it can give it back
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node2"]


def test_a_quarantine_slurm_never_made_is_abandoned(tmp_path: Path) -> None:
    slurm = LateSlurm(NODES)
    slurm.silent = frozenset({"create_reservation"})
    ops = NodeOps(settings(tmp_path), slurm)
    with pytest.raises(SlurmUnavailable):
        ops.quarantine(["node1"], "slow")
    assert phases(ops, "quarantine") == ["intent"]
    slurm.silent = frozenset()
    ops.reconcile()
    assert phases(ops, "quarantine") == ["intent", "abandoned"]
    assert slurm.reservations() == [] and owners(ops)["node1"] == "in service"


def test_a_definite_refusal_is_failed(tmp_path: Path) -> None:
    slurm = LateSlurm(NODES)
    ops = NodeOps(settings(tmp_path), slurm)
    slurm.create_reservation("guardctl_q_node1", ["node1"], ["root"])  # a name clash
    slurm.delete_reservation("guardctl_q_node1")
    slurm.create_reservation("guardctl_q_node1", ["node2"], ["root"])
    with pytest.raises(SlurmError, match="Duplicate"):
        ops.quarantine(["node1"], "slow")
    assert phases(ops, "quarantine") == ["intent", "failed"]


def test_a_late_drain_of_a_quarantined_node_is_settled_and_its_reservation_deleted(
    tmp_path: Path,
) -> None:
    slurm = LateSlurm(NODES)
    ops = NodeOps(settings(tmp_path), slurm)
    ops.quarantine(["node1"], "suspect")
    slurm.late = frozenset({"drain"})
    with pytest.raises(SlurmUnavailable):
        ops.drain(["node1"], "failed sweep")
    slurm.late = frozenset()
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1"]
    ops.reconcile()
    assert phases(ops, "drain") == ["intent", "reconciled"]
    assert slurm.reservations() == []  # the drain's own second step, done by reconcile
    assert phases(ops, "release")[-2:] == ["intent", "done"]
    assert owners(ops)["node1"] == "drained by guardctl"


def test_an_outcome_line_lost_in_a_live_daemon_is_reconciled(tmp_path: Path) -> None:
    class LosesDone(ActionLog):
        lose = True

        def append(self, entry: Entry) -> Entry:
            if self.lose and entry.phase == "done":
                self.lose = False
                raise StoreError("the store is full: cannot write the action log")
            return super().append(entry)

    slurm = LateSlurm(NODES)
    ops = NodeOps(settings(tmp_path), slurm)
    ops.log = LosesDone(ops.settings.store.root)
    with pytest.raises(StoreError):
        ops.quarantine(["node1"], "slow")
    assert phases(ops, "quarantine") == ["intent"]
    # The same process (a daemon) goes on: its own intent is not in flight any more.
    ops.quarantine(["node2"], "slow")
    assert phases(ops, "quarantine")[:2] == ["intent", "reconciled"]
    assert owners(ops)["node1"] == "quarantined"
    with pytest.raises(RefusedError, match="cap: guardctl would hold 5"):
        ops.quarantine(["node3", "node4", "node5"], "slow")


def test_a_drain_whose_release_failed_does_not_leak_the_quarantine(tmp_path: Path) -> None:
    slurm = MemorySlurm(NODES)
    ops = NodeOps(settings(tmp_path), slurm)
    ops.quarantine(["node1"], "suspect")
    sweep = slurm.submit(
        SubmitRequest(
            "gemm.sbatch",
            nodes=("node1",),
            reservation="guardctl_q_node1",
            job_name="guardctl-gemm",
        )
    )
    slurm.advance(1)  # a sweep job still running in it: Slurm refuses to delete it
    with pytest.raises(SlurmError, match="busy"):
        ops.drain(["node1"], "failed sweep")
    assert phases(ops, "release") == ["intent", "failed"]
    slurm.finish(sweep)
    slurm.resume(["node1"])  # repaired and resumed by an administrator
    ops.reconcile()  # the next acting command
    assert slurm.reservations() == []
    assert owners(ops)["node1"] == "in service"
    release = [e for e in ActionLog(tmp_path / "store").entries() if e.action == "release"]
    assert (release[-1].phase, release[-1].evidence["because"]) == ("done", "drained")
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=("node1",), job_name="train"))
    slurm.advance(1)
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]


def test_the_cap_counts_guardctls_nodes_whoever_else_holds_them(tmp_path: Path) -> None:
    slurm = MemorySlurm(NODES)
    ops = NodeOps(settings(tmp_path, max_out_nodes=2), slurm)
    ops.quarantine(["node1", "node2"], "suspect")
    slurm.set_down("node1")  # it went DOWN in guardctl's reservation
    slurm.drain(["node2"], "admin: RMA")  # an administrator drained it on top
    assert owners(ops)["node1"] == owners(ops)["node2"] == "held by someone else"
    for more in (["node3"], ["node3", "node4"]):
        with pytest.raises(RefusedError, match="cap: guardctl would hold"):
            ops.quarantine(more, "suspect")
    assert {r.name for r in slurm.reservations()} == {"guardctl_q_node1", "guardctl_q_node2"}
    assert not [e for e in ops.log.entries() if e.nodes == ("node3",)]


def test_the_cap_counts_a_drain_in_flight_elsewhere(tmp_path: Path) -> None:
    slurm = MemorySlurm(NODES)
    ops = NodeOps(settings(tmp_path, max_out_nodes=2), slurm)
    # Another host's guardctl is draining node3 (its intent ten seconds old, no outcome yet).
    _line(
        ops.log.path,
        action="drain",
        phase="intent",
        nodes=["node3"],
        host="other-host",
        pid=1,
        reason="guardctl: failed sweep",
    )
    ops.quarantine(["node1"], "suspect")
    with pytest.raises(RefusedError, match="cap: guardctl would hold 3"):
        ops.quarantine(["node2"], "suspect")
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1"]


def _line(path: Path, **fields: Any) -> str:
    raw = {
        "id": uuid.uuid4().hex[:16],
        "ts": time.time() - 10,
        "actor": "ops@h",
        "reason": "guardctl: x",
        **fields,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(raw) + "\n")
    return str(raw["id"])


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_writer_is_its_machine_boot_and_process_not_its_hostname(tmp_path: Path) -> None:
    slurm = MemorySlurm(NODES)
    ops = NodeOps(settings(tmp_path), slurm)
    slurm.create_reservation("guardctl_q_node5", ["node5"], ["root"])
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    me = {
        "machine": Path("/etc/machine-id").read_text().strip(),
        "boot": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pidns": os.stat("/proc/self/ns/pid").st_ino,
        "pid": os.getpid(),
        "start": start,
    }
    # Another container with this hostname, its pid free here: in flight there, not dead.
    dead = _dead_pid()
    other = _line(
        ops.log.path,
        action="quarantine",
        phase="intent",
        nodes=["node5"],
        host=socket.gethostname(),
        pid=dead,
        evidence={"reservation": "guardctl_q_node5"},
        writer={**me, "machine": "f" * 32, "pid": dead},
    )
    # This machine, a pid reused by another process since (its start time differs).
    reused = _line(
        ops.log.path,
        action="drain",
        phase="intent",
        nodes=["node6"],
        host=socket.gethostname(),
        pid=os.getpid(),
        writer={**me, "start": start + 1},
    )
    ops.reconcile()
    closed = {e.id: e.phase for e in ops.log.entries() if e.phase != "intent"}
    assert closed == {reused: "abandoned"}
    assert other not in closed
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node5"]


def _leftovers(tmp_path: Path, slurm: MemorySlurm) -> tuple[int, str]:
    """An open intent and a dead sweep's reservation with its job still running in it."""
    root = tmp_path / "store"
    log = root / "actions" / "actions.jsonl"
    pid = _dead_pid()
    slurm.create_reservation("guardctl_q_node4", ["node4"], ["root"])
    _line(
        log,
        action="quarantine",
        phase="intent",
        nodes=["node4"],
        host=socket.gethostname(),
        pid=pid,
        evidence={"reservation": "guardctl_q_node4"},
    )
    slurm.create_reservation("guardctl_s_s9_1", ["node5", "node6"], ["root"])
    job = slurm.submit(
        SubmitRequest(
            "pairwise.sbatch",
            nodes=("node5", "node6"),
            reservation="guardctl_s_s9_1",
            job_name="guardctl-pair",
        )
    )
    slurm.advance(1)
    _line(
        log,
        action="sweep reserve",
        phase="done",
        nodes=["node5", "node6"],
        host=socket.gethostname(),
        pid=pid,
        evidence={
            "sweep": "s9",
            "reservation": "guardctl_s_s9_1",
            "partners": ["node6"],
            "host": socket.gethostname(),
            "pid": pid,
        },
    )
    return job, log.read_text()


def _slurm_state(slurm: MemorySlurm) -> tuple[Any, ...]:
    return (slurm.nodes(), slurm.reservations(), slurm.jobs())


@pytest.mark.parametrize("observe_only", [False, True])
def test_reading_and_observing_change_nothing_in_slurm(tmp_path: Path, observe_only: bool) -> None:
    fleet_trace(tmp_path / "store", NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    job, _ = _leftovers(tmp_path, slurm)
    before = _slurm_state(slurm)
    base = load_settings(environ={"GUARDCTL_STORE": str(tmp_path / "store")})
    cfg = dataclasses.replace(
        base,
        safety=dataclasses.replace(
            base.safety, observe_only=observe_only, max_out_fraction=1.0, max_out_nodes=8
        ),
    )
    ops = NodeOps(cfg, slurm)
    ops.status()
    ops.log.history(["node4"])
    ops.drain(["node7"], "slow", dry_run=True)
    ops.quarantine(["node7"], "slow", dry_run=True)
    watcher = Controller(cfg, act=observe_only, slurm=slurm)  # observe_only: --act is moot
    report = watcher.run_pass()
    assert not report.acting and report.reconciled == 0
    watcher.run_pass(dry_run=True)
    watcher.explain("node2")
    assert _slurm_state(slurm) == before
    assert slurm.job(job).state == "RUNNING"  # type: ignore[union-attr]
    assert [(e.action, e.phase) for e in ops.log.entries() if e.action in NODE_ACTIONS] == [
        ("quarantine", "intent"),
        ("sweep reserve", "done"),
    ]  # as the leftovers were
    assert ops.open_intents() == 2
    if not observe_only:  # the next acting command reconciles them
        assert len(NodeOps(cfg, slurm).reconcile()) >= 2
        assert [r.name for r in slurm.reservations()][:1] == ["guardctl_q_node4"]
        assert slurm.job(job).state == "CANCELLED"  # type: ignore[union-attr]


def test_every_node_in_a_guardctl_quarantine_has_a_decision(tmp_path: Path) -> None:
    fleet_trace(tmp_path / "store", NODES)  # nothing flagged
    slurm = MemorySlurm(NODES, start=time.time())
    cfg = load_settings(environ={"GUARDCTL_STORE": str(tmp_path / "store")})
    NodeOps(cfg, slurm).quarantine(["node3"], "operator: looks slow")  # not the controller's
    report = Controller(cfg, act=False, slurm=slurm).run_pass()
    (d,) = report.decisions
    assert (d["node"], d["decision"]) == ("node3", "leave")
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node3"]


@pytest.mark.slurm
@pytest.mark.parametrize("observe_only", [False, True])
def test_read_commands_and_observe_only_leave_the_lab_as_it_was(
    lab: Any, tmp_path: Path, observe_only: bool
) -> None:
    import sys

    from guardctl.storage import store

    root = tmp_path / "store"
    store.init(root)
    config = tmp_path / "guardctl.toml"
    config.write_text(
        f'[store]\nroot = "{root}"\n[slurm]\nconf = "{lab.conf}"\n'
        + (f'bin_dir = "{lab.bin_dir}"\n' if lab.bin_dir else "")
        + "[safety]\nmax_out_nodes = 4\nmax_out_fraction = 1.0\n"
    )

    def gctl(*args: str, env: dict[str, str] | None = None) -> Any:
        return subprocess.run(
            [sys.executable, "-m", "guardctl", "--config", str(config), *args],
            env={**lab.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    # Leftovers: a quarantine whose guardctl died after Slurm made it (its intent open), and a
    # dead sweep's reservation with its job still running in it.
    crashed = gctl("quarantine", "node2", env={"GUARDCTL_TEST_CRASH": "quarantine:after-slurm"})
    assert crashed.returncode == 99, crashed.stderr
    lab.sh(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=guardctl_s_s9_1",
        "Nodes=node3,node4",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
        "StartTime=now",
        "Duration=infinite",
    )
    job = lab.submit("#!/bin/bash\nsleep 600\n", "--reservation=guardctl_s_s9_1", "-w", "node3")
    deadline = time.monotonic() + 30
    while lab.job_info(job).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    pid = _dead_pid()
    log = root / "actions" / "actions.jsonl"
    _line(
        log,
        action="sweep reserve",
        phase="done",
        nodes=["node3", "node4"],
        host=socket.gethostname(),
        pid=pid,
        evidence={
            "sweep": "s9",
            "reservation": "guardctl_s_s9_1",
            "partners": ["node4"],
            "host": socket.gethostname(),
            "pid": pid,
        },
    )
    fleet_trace(root, ["node1", "node2", "node3", "node4"], slow={"node1": 1.3})
    if observe_only:
        config.write_text(config.read_text() + "observe_only = true\n")

    def slurm_now() -> tuple[Any, ...]:
        text = lab.sh("scontrol", "show", "-o", "reservation").stdout
        return (
            sorted(re.findall(r"ReservationName=(\S+) .*?Nodes=(\S+)", text)),
            [lab.node_state(n).get("reason", "") for n in ("node1", "node2", "node3")],
            ["DRAIN" in lab.node_state(n).get("state_flags", []) for n in ("node1", "node2")],
        )

    before = slurm_now()
    assert [r for r, _ in before[0]] == ["guardctl_q_node2", "guardctl_s_s9_1"]
    logged = log.read_text()
    commands = [
        ("status",),
        ("status", "--json"),
        ("history",),
        ("analyze",),
        ("report",),
        ("control", "--once"),
        ("control", "--explain", "node1"),
        ("control", "--once", "--dry-run"),
        ("drain", "node1", "--reason", "x", "--dry-run"),
    ]
    if observe_only:
        commands += [("control", "--once", "--act"), ("quarantine", "node1")]
    for args in commands:
        done = gctl(*args)
        assert "Traceback" not in done.stderr, (args, done.stderr)
    assert slurm_now() == before
    assert lab.job_info(job)["JobState"] == "RUNNING"
    shown = gctl("status")
    assert "2 intent(s) or leftover reservation(s) open" in shown.stderr, shown.stderr
    assert [
        line
        for line in log.read_text().splitlines()
        if '"phase":"intent"' in line
        or '"phase":"done"' in line
        or '"phase":"reconciled"' in line
        or '"phase":"abandoned"' in line
    ] == [
        line
        for line in logged.splitlines()
        if '"phase":"intent"' in line or '"phase":"done"' in line
    ]


def test_a_sweep_reservation_made_but_answered_late_is_deleted(tmp_path: Path) -> None:
    slurm = LateSlurm(NODES)
    ops = NodeOps(settings(tmp_path), slurm)
    ops.quarantine(["node1"], "suspect")
    slurm.late = frozenset({"create_reservation"})
    with pytest.raises(SlurmUnavailable):  # the sweep fails: it never learns of the reservation
        ops.reserve_for_sweep(["node1", "node2"], "s1", "guardctl_s_s1_1")
    slurm.late = frozenset()
    assert {r.name for r in slurm.reservations()} == {"guardctl_q_node1", "guardctl_s_s1_1"}
    ops.reconcile()  # the same live daemon's next acting step
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1"]
    assert phases(ops, "sweep reserve") == ["intent", "reconciled"]
    assert phases(ops, "sweep unreserve") == ["intent", "done"]
    assert owners(ops)["node2"] == "in service"
