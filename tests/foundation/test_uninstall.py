"""guardctl uninstall: what guardctl holds in Slurm, given back through the node-action door,
and refused while a controller leads."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from guardctl.config import Settings, load_settings
from guardctl.controller.lease import Lease
from guardctl.errors import ExitCode, RefusedError
from guardctl.nodeops import NodeOps
from guardctl.nodeops.cleanup import give_back, held, refuse_while_leading
from guardctl.slurm.memory import MemorySlurm
from guardctl.storage import store as shared_store

NODES = [f"node{i}" for i in range(1, 7)]


def settings(tmp_path: Path) -> Settings:
    base = load_settings(environ={"GUARDCTL_STORE": str(tmp_path / "store")})
    return dataclasses.replace(
        base, safety=dataclasses.replace(base.safety, max_out_fraction=0.9, max_out_nodes=6)
    )


def fleet(tmp_path: Path) -> tuple[NodeOps, MemorySlurm]:
    slurm = MemorySlurm(NODES, start=time.time())
    ops = NodeOps(settings(tmp_path), slurm, clock=slurm.time)
    ops.quarantine(["node1"], "suspect")
    ops.drain(["node2"], "sweep failed")
    ops.reserve_for_sweep(["node3"], "20261206T000000-ab12", "guardctl_s_ab12")
    slurm.drain(["node5"], "ops: fan replaced")  # someone else's: never guardctl's to give back
    slurm.create_reservation("guardctl_q_node6", ["node6"], ["root"])  # not in guardctl's log
    return ops, slurm


def test_lists_what_guardctl_holds_and_what_only_looks_like_it(tmp_path: Path) -> None:
    ops, slurm = fleet(tmp_path)
    listed = {(h.kind, h.name) for h in held(ops)}
    assert listed == {
        ("quarantined", "node1"),
        ("drained", "node2"),
        ("sweep reservation", "guardctl_s_ab12"),
        ("not in guardctl's log", "guardctl_q_node6"),
    }
    before = (slurm.nodes(), slurm.reservations(), len(ops.log.entries()))
    done = give_back(ops, dry_run=True)
    assert all(h.result.startswith(("would do", "left alone")) for h in done), done
    assert (slurm.nodes(), slurm.reservations(), len(ops.log.entries())) == before


def test_gives_back_through_the_door_and_leaves_the_rest(tmp_path: Path) -> None:
    ops, slurm = fleet(tmp_path)
    done = {h.name: h.result for h in give_back(ops, dry_run=False)}
    assert done["node1"].startswith("done") and done["node2"].startswith("done")
    assert done["guardctl_s_ab12"] == "done: deleted reservation guardctl_s_ab12"
    assert done["guardctl_q_node6"].startswith("left alone")
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node6"]
    drained = {n.name: n.reason for n in slurm.nodes() if n.drained}
    assert drained == {"node5": "ops: fan replaced"}
    logged = {(e.action, e.phase) for e in ops.log.entries()}
    assert {("release", "done"), ("resume", "done"), ("sweep unreserve", "done")} <= logged
    assert held(ops) == [h for h in held(ops) if h.kind == "not in guardctl's log"]


def test_refused_while_a_controller_holds_the_lease(tmp_path: Path) -> None:
    s = settings(tmp_path)
    lease = Lease(s.store.root, s.control.lease_s)
    assert lease.acquire()[0]
    try:
        refuse_while_leading(s)
    except RefusedError as exc:
        assert "holds the controller lease" in str(exc) and "--force" in str(exc)
    else:
        raise AssertionError("not refused while a controller leads")
    lease.release()
    refuse_while_leading(s)  # released: nobody leads


def guardctl(store: Path, *args: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    env["GUARDCTL_STORE"] = str(store)
    cfg = store.parent / "g.toml"
    cfg.write_text(extra)
    return subprocess.run(
        [sys.executable, "-m", "guardctl", "--config", str(cfg), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_refuses_in_one_line_while_a_controller_leads(tmp_path: Path) -> None:
    s = settings(tmp_path)
    shared_store.init(s.store.root)
    lease = Lease(s.store.root, s.control.lease_s)
    assert lease.acquire()[0]  # this test process is the live controller
    proc = guardctl(s.store.root, "uninstall")
    assert proc.returncode == ExitCode.REFUSED, proc.stderr
    assert proc.stderr.count("\n") == 1 and "holds the controller lease" in proc.stderr
    lease.release()


def test_uninstall_over_the_lab(lab: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shared_store.init(store)
    slurm = f"[slurm]\n{lab.slurm_toml()}[safety]\nmax_out_fraction = 0.75\nmax_out_nodes = 3\n"
    assert guardctl(store, "quarantine", "node1", extra=slurm).returncode == 0
    assert guardctl(store, "drain", "node2", "--reason", "slow", extra=slurm).returncode == 0
    assert "guardctl_q_node1" in lab.sh("scontrol", "show", "reservation").stdout
    listed = guardctl(store, "uninstall", "--dry-run", extra=slurm)
    assert listed.returncode == 0, listed.stderr
    assert "quarantined: node1" in listed.stdout and "drained: node2" in listed.stdout
    assert "DRAIN" in lab.node_state("node2")["state_flags"]  # a dry run changes nothing
    done = guardctl(store, "uninstall", extra=slurm)
    assert done.returncode == 0, done.stderr
    assert "guardctl_q_node1" not in lab.sh("scontrol", "show", "reservation").stdout
    assert "DRAIN" not in lab.node_state("node2")["state_flags"]
    history = guardctl(store, "history", "--json", extra=slurm).stdout
    assert '"release"' in history and '"resume"' in history
