"""The Slurm hooks under attack and under a bad configuration push, over the in-memory Slurm.

A user who points the job's stderr file at a root-only file must not get it written or given
to them by the prolog (root runs it). A failing check must not make a hook fail where guardctl
did not drain the node itself: Slurm would drain it then, outside guardctl's cap.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guardctl.actionlog import ActionLog, Entry
from guardctl.config import Layer, Settings, build_settings
from guardctl.hooks.run import HOOK_FAILED, HookReport, expand_path, run_hook
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.storage import store

REPO = Path(__file__).resolve().parents[2]
SYSFS = REPO / "tests" / "fixtures" / "sysfs" / "ib8"
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "nvml"))
from fake_pynvml import FakeNvml  # noqa: E402

NOBODY = 65534  # nobody:nogroup on Debian: a user who owns nothing
NODES = [f"node{i}" for i in range(1, 9)]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog runs as root")


def faulty_sysfs(tmp_path: Path) -> Path:
    """A node whose first InfiniBand port is down: the ib_port check fails."""
    tree = tmp_path / "sys"
    if not tree.exists():
        shutil.copytree(SYSFS, tree)
        (tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    return tree


def settings(
    tmp_path: Path,
    *,
    marked: bool = True,
    sysfs: Path | None = None,
    hooks: dict[str, Any] | None = None,
    **safety: Any,
) -> Settings:
    root = tmp_path / "store"
    if marked:
        store.init(root)
    table = {
        "store": {"root": str(root)},
        "safety": {"max_out_fraction": 0.5, "max_out_nodes": 4, **safety},
        "agent": {"sysfs_root": str(sysfs or faulty_sysfs(tmp_path))},
        "sweep": {"hook_gpus": 0},
        **({"hooks": hooks} if hooks else {}),
    }
    return build_settings([Layer("test", table)])


def no_gpus() -> Any:
    fake = FakeNvml("h200_sxm_8gpu.json")
    fake.no_driver = True  # only the InfiniBand check has something to say
    return fake.module()


def prolog(cfg: Settings, slurm: MemorySlurm, node: str, **env: str) -> HookReport:
    environ = {"SLURMD_NODENAME": node, "SLURM_JOB_ID": "42", **env}
    return run_hook(cfg, "prolog", environ=environ, nvml=no_gpus(), ops=NodeOps(cfg, slurm))


def drained(slurm: MemorySlurm) -> dict[str, str]:
    return {n.name: n.reason for n in slurm.nodes() if n.drained}


def hook_notes(cfg: Settings) -> list[Entry]:
    return [e for e in NodeOps(cfg, MemorySlurm(NODES)).log.entries() if e.action == HOOK_FAILED]


# -- 1. the note in the job's stderr file -----------------------------------------------------


@pytest.fixture
def top() -> Iterator[Path]:
    """A directory every user can reach (pytest's own tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="guardctl-hooks-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def user_dir(top: Path, owner: int = NOBODY) -> Path:
    home = top / "home"
    home.mkdir(mode=0o755)
    os.chown(home, owner, owner)
    return home


def root_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret:19000::::::\n")
    os.chmod(secret, 0o600)
    return secret


def as_job_of_nobody(path: Path, **more: str) -> dict[str, str]:
    return {
        "SLURM_JOB_STDERR": str(path),
        "SLURM_JOB_UID": str(NOBODY),
        "SLURM_JOB_GID": str(NOBODY),
        "SLURM_JOB_USER": "nobody",
        **more,
    }


@needs_root
@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_to_a_root_file_is_neither_written_nor_given_away(
    tmp_path: Path, top: Path, link: str
) -> None:
    secret = root_secret(top)
    home = user_dir(top)
    err = home / "err.txt"
    if link == "symlink":
        err.symlink_to(secret)
    else:
        os.link(secret, err)  # made here as root; the kernel's protected_hardlinks aside
    cfg = settings(tmp_path)
    slurm = MemorySlurm(NODES)
    report = prolog(cfg, slurm, "node2", **as_job_of_nobody(err))
    info = os.stat(secret)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o600)
    assert secret.read_text() == "root:$6$secret:19000::::::\n"
    assert report.fails  # guardctl drained the node: the job is requeued
    assert drained(slurm) == {"node2": "guardctl: prolog: ib mlx5_0/1 state DOWN"}
    assert report.told_user.startswith(f"not written to {err}")
    assert err.is_symlink() == (link == "symlink")


@needs_root
def test_a_directory_the_user_cannot_write_gets_nothing(tmp_path: Path, top: Path) -> None:
    home = user_dir(top, owner=0)  # root's 0755 directory
    err = home / "err.txt"
    report = prolog(settings(tmp_path), MemorySlurm(NODES), "node2", **as_job_of_nobody(err))
    assert not err.exists()
    assert report.fails
    assert report.told_user == (
        f"not written to {err}: Permission denied; the reason is the node's drain reason"
    )


@needs_root
def test_the_note_is_written_as_the_job_user(tmp_path: Path, top: Path) -> None:
    home = user_dir(top)
    err = home / "err.txt"
    report = prolog(settings(tmp_path), MemorySlurm(NODES), "node2", **as_job_of_nobody(err))
    assert report.told_user == f"written to {err}"
    assert "node node2 failed the prolog checks (prolog: ib mlx5_0/1 state DOWN)" in err.read_text()
    assert (err.stat().st_uid, err.stat().st_gid) == (NOBODY, NOBODY)


@needs_root
def test_a_fifo_neither_blocks_the_prolog_nor_is_written(tmp_path: Path, top: Path) -> None:
    home = user_dir(top)
    err = home / "err.txt"
    os.mkfifo(err)
    os.chown(err, NOBODY, NOBODY)
    cfg, slurm = settings(tmp_path), MemorySlurm(NODES)
    done: list[HookReport] = []
    worker = threading.Thread(
        target=lambda: done.append(prolog(cfg, slurm, "node2", **as_job_of_nobody(err))),
        daemon=True,
    )
    worker.start()
    worker.join(20)
    assert done, "the prolog blocked opening a FIFO the user made"
    assert done[0].told_user.startswith(f"not written to {err}")


@needs_root
def test_slurm_patterns_are_expanded_or_the_note_is_not_written(tmp_path: Path, top: Path) -> None:
    home = user_dir(top)
    env = as_job_of_nobody(home / "%x-%j.err", SLURM_JOB_NAME="train")
    report = prolog(settings(tmp_path), MemorySlurm(NODES), "node2", **env)
    assert report.told_user == f"written to {home / 'train-42.err'}"
    assert "failed the prolog checks" in (home / "train-42.err").read_text()
    per_task = as_job_of_nobody(home / "out-%N-%t.err")
    report = prolog(settings(tmp_path), MemorySlurm(NODES), "node3", **per_task)
    assert report.told_user == (
        f"not written to {home}/out-%N-%t.err: guardctl cannot expand "
        "%N, %t on this node; the reason is the node's drain reason"
    )
    assert list(home.iterdir()) == [home / "train-42.err"]


def test_expand_path_knows_only_what_the_prolog_environment_says() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_USER": "ann",
        "SLURM_ARRAY_JOB_ID": "5",
        "SLURM_ARRAY_TASK_ID": "3",
    }
    assert expand_path("/h/%u/%A_%a.%4j.err", env) == ("/h/ann/5_3.0007.err", "")
    assert expand_path("/h/100%%.err", env) == ("/h/100%.err", "")
    assert expand_path("/h/%a.err", {"SLURM_JOB_ID": "7"})[0] == ""  # not an array job
    assert expand_path("err.txt", env) == ("", "the path is not absolute")
    assert expand_path("/h/\\%j", env)[0] == ""


# -- 2. the cap, a bad configuration push, a store that is not mounted -------------------------


def test_above_the_cap_a_failing_prolog_passes_and_alerts(tmp_path: Path) -> None:
    cfg = settings(tmp_path, max_out_nodes=1)
    slurm = MemorySlurm(NODES)
    NodeOps(cfg, slurm).drain(["node1"], "bad DIMM")  # guardctl holds one node: the cap
    report = prolog(cfg, slurm, "node2")
    assert not report.fails  # the job runs; Slurm does not drain the node behind the cap
    assert drained(slurm) == {"node1": "guardctl: bad DIMM"}
    assert "cap: guardctl would hold 2 node(s)" in report.alerts[0]
    assert report.alerts[0].endswith("passing: the node stays in service")
    (note,) = hook_notes(cfg)
    assert note.nodes == ("node2",) and note.evidence["drained"] is False
    assert "cap:" in note.evidence["outcome"]


def test_fail_when_not_drained_lets_slurm_drain_the_node(tmp_path: Path) -> None:
    cfg = settings(tmp_path, max_out_nodes=1, hooks={"fail_when_not_drained": True})
    slurm = MemorySlurm(NODES)
    NodeOps(cfg, slurm).drain(["node1"], "bad DIMM")
    report = prolog(cfg, slurm, "node2")
    assert report.fails and "exiting 1 (hooks.fail_when_not_drained)" in report.alerts[0]
    assert drained(slurm) == {"node1": "guardctl: bad DIMM"}  # guardctl itself did nothing


def test_a_bad_configuration_push_is_a_fleet_finding_not_node_faults(tmp_path: Path) -> None:
    # Every node's ports are fine, but the pushed floor is above their rate: every prolog fails.
    cfg = settings(tmp_path, sysfs=SYSFS)
    cfg = dataclasses.replace(
        cfg, sweep=dataclasses.replace(cfg.sweep, hook_ib_min_rate_gbps=800.0)
    )
    slurm = MemorySlurm(NODES)
    reports = [prolog(cfg, slurm, node) for node in NODES[:5]]
    assert [r.fails for r in reports] == [True, True, False, False, False]
    assert sorted(drained(slurm)) == ["node1", "node2"]  # below burst_nodes = 3: node faults
    assert (
        "fleet-wide: 3 nodes (node[1-3]) failed the ib_port check within 600 s"
        in reports[2].alerts[0]
    )
    assert "fleet-wide: 5 nodes" in reports[4].alerts[0]
    notes = hook_notes(cfg)
    assert [(e.nodes, e.evidence["drained"]) for e in notes] == [
        (("node1",), True),
        (("node2",), True),
        (("node3",), False),
        (("node4",), False),
        (("node5",), False),
    ]
    # The same node failing again within the window is not noted again.
    assert not prolog(cfg, slurm, "node4").fails
    assert len(hook_notes(cfg)) == 5


def test_a_node_guardctl_drained_failing_again_is_not_news(tmp_path: Path) -> None:
    cfg = settings(tmp_path)
    slurm = MemorySlurm(NODES)
    assert prolog(cfg, slurm, "node1").fails
    for _ in range(3):  # its health check, every HealthCheckInterval
        again = run_hook(
            cfg,
            "healthcheck",
            environ={"SLURMD_NODENAME": "node1"},
            nvml=no_gpus(),
            ops=NodeOps(cfg, slurm),
        )
        assert again.fails and again.drained.startswith("no change: already drained")
    assert [e.nodes for e in hook_notes(cfg)] == [("node1",)]
    assert drained(slurm) == {"node1": "guardctl: prolog: ib mlx5_0/1 state DOWN"}


def test_an_unmounted_store_drains_nothing_and_creates_nothing(tmp_path: Path) -> None:
    cfg = settings(tmp_path, marked=False)
    slurm = MemorySlurm(NODES)
    report = prolog(cfg, slurm, "node2")
    assert not report.fails and drained(slurm) == {}
    assert "is not guardctl's shared store: .guardctl-store is missing" in report.alerts[0]
    assert not (tmp_path / "store").exists()  # nothing written on the local disk


# -- 3. on the lab: what Slurm itself does with the prolog's exit -----------------------------


def test_at_the_cap_slurm_runs_the_job_and_drains_nothing(lab_factory: Any, tmp_path: Path) -> None:
    from labtools import job_guardctl

    os.chmod(tmp_path, 0o755)
    root = tmp_path / "store"
    store.init(root)
    config = tmp_path / "guardctl.toml"
    wrapper = tmp_path / "prolog-wrapper.sh"
    # Test harness only: every node's prolog sees a sysfs tree whose InfiniBand port is down.
    wrapper.write_text(
        "#!/bin/bash\n"
        f"GUARDCTL={job_guardctl()} GUARDCTL_CONFIG={config} "
        f"exec {REPO / 'slurm' / 'prolog.sh'}\n"
    )
    wrapper.chmod(0o755)
    lab = lab_factory(nodes=2, up_args=["--prolog", str(wrapper)])
    config.write_text(
        f'[store]\nroot = "{root}"\n[slurm]\nconf = "{lab.conf}"\n'
        + (f'bin_dir = "{lab.bin_dir}"\n' if lab.bin_dir else "")
        + "[safety]\nmax_out_nodes = 1\n"
        + f'[agent]\nsysfs_root = "{faulty_sysfs(tmp_path)}"\n'
    )
    # The operator's drain runs on this host (the hooks run guardctl where the lab's jobs do).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "guardctl",
            "--config",
            str(config),
            "drain",
            "node1",
            "--reason",
            "bad DIMM",
        ],
        env=lab.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr  # guardctl holds one node: its cap
    job = lab.submit(
        "#!/bin/bash\necho ran on $SLURMD_NODENAME\n",
        "-w",
        "node2",
        "-o",
        str(tmp_path / "job.out"),
    )
    assert lab.wait_job(job, timeout=60)["JobState"] == "COMPLETED"
    assert "ran on node2" in (tmp_path / "job.out").read_text()
    assert "DRAIN" not in lab.node_state("node2")["state_flags"]  # Slurm did not drain it
    assert lab.node_state("node1")["reason"] == "guardctl: bad DIMM"
    notes = [e for e in ActionLog(root).entries() if e.action == HOOK_FAILED]
    assert [(e.nodes, e.evidence["drained"]) for e in notes] == [(("node2",), False)]
    assert "cap: guardctl would hold 2 node(s)" in notes[0].evidence["outcome"]
