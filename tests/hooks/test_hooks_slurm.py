"""The hook scripts with Slurm's empty environment, and a failing prolog in a real lab."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from labtools import job_guardctl

from guardctl.storage import store as shared_store

REPO = Path(__file__).resolve().parents[2]
SYSFS = REPO / "tests" / "fixtures" / "sysfs" / "ib8"
GUARDCTL = str(Path(sys.executable).parent / "guardctl")


def faulty_sysfs(tmp_path: Path) -> Path:
    tree = tmp_path / "sys"
    shutil.copytree(SYSFS, tree)
    (tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    return tree


def config(tmp_path: Path, name: str, conf: Path, sysfs: Path, bin_dir: Path | None = None) -> Path:
    store = tmp_path / "store"
    shared_store.init(store)  # what the administrator does once, at install time
    path = tmp_path / name
    slurm = f'conf = "{conf}"\n' + (f'bin_dir = "{bin_dir}"\n' if bin_dir else "")
    path.write_text(
        f'[store]\nroot = "{store}"\n[slurm]\n{slurm}'
        "[safety]\nmax_out_fraction = 0.5\nmax_out_nodes = 2\n"
        f'[agent]\nsysfs_root = "{sysfs}"\n'
    )
    return path


def test_hooks_pass_with_an_empty_environment(tmp_path: Path) -> None:
    cfg = config(tmp_path, "ok.toml", tmp_path / "no-slurm.conf", SYSFS)
    for hook in ("prolog", "epilog", "healthcheck"):
        proc = subprocess.run(
            [
                "env",
                "-i",
                f"GUARDCTL={GUARDCTL}",
                f"GUARDCTL_CONFIG={cfg}",
                "SLURMD_NODENAME=node1",
                "SLURM_JOB_ID=7",
                str(REPO / "slurm" / f"{hook}.sh"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, (hook, proc.stderr)


def test_missing_guardctl_never_fails_the_node(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["env", "-i", "GUARDCTL=/nonexistent/guardctl", str(REPO / "slurm" / "prolog.sh")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and "guardctl not found" in proc.stderr


def test_failing_check_drains_through_guardctl_with_empty_env(lab: Any, tmp_path: Path) -> None:
    cfg = config(tmp_path, "bad.toml", lab.conf, faulty_sysfs(tmp_path), lab.bin_dir)
    proc = subprocess.run(
        [
            "env",
            "-i",
            f"GUARDCTL={GUARDCTL}",
            f"GUARDCTL_CONFIG={cfg}",
            "SLURMD_NODENAME=node2",
            str(REPO / "slurm" / "healthcheck.sh"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    state = lab.node_state("node2")
    assert "DRAIN" in state["state_flags"]
    assert state["reason"] == "guardctl: healthcheck: ib mlx5_0/1 state DOWN"


def test_prolog_fault_drains_the_node_and_requeues_the_job(
    lab_factory: Any, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o755)
    good = config(tmp_path, "good.toml", tmp_path / "slurm.conf", SYSFS)
    bad = config(tmp_path, "bad.toml", tmp_path / "slurm.conf", faulty_sysfs(tmp_path))
    # Test harness only: node2's hook sees the faulty sysfs tree, node1's the healthy one.
    wrapper = tmp_path / "prolog-wrapper.sh"
    wrapper.write_text(
        "#!/bin/bash\n"
        f'if [ "$SLURMD_NODENAME" = node2 ]; then cfg={bad}; else cfg={good}; fi\n'
        f"GUARDCTL={job_guardctl()} GUARDCTL_CONFIG=$cfg exec {REPO / 'slurm' / 'prolog.sh'}\n"
    )
    wrapper.chmod(0o755)
    lab = lab_factory(nodes=2, up_args=["--prolog", str(wrapper)])
    for path in (good, bad):  # the lab's slurm.conf is only known now
        path.write_text(path.read_text().replace(str(tmp_path / "slurm.conf"), str(lab.conf)))
    err = tmp_path / "job.err"
    job = lab.submit(
        "#!/bin/bash\necho ran on $SLURMD_NODENAME\n",
        "-w",
        "node2",
        "-o",
        str(tmp_path / "job.out"),
        "-e",
        str(err),
    )
    deadline = time.monotonic() + 60
    while "DRAIN" not in lab.node_state("node2")["state_flags"]:
        assert time.monotonic() < deadline, lab.log_tail()
        time.sleep(0.3)
    assert lab.node_state("node2")["reason"] == "guardctl: prolog: ib mlx5_0/1 state DOWN"
    deadline = time.monotonic() + 30
    while "requeue" not in lab.job_info(job).get("Reason", "").lower():
        assert time.monotonic() < deadline, lab.job_info(job)
        time.sleep(0.3)
    info = lab.job_info(job)
    assert info["JobState"] == "PENDING" and int(info["Restarts"]) >= 1
    assert "failed the prolog checks (prolog: ib mlx5_0/1 state DOWN)" in err.read_text()
    # node1 is healthy: its prolog passes and jobs run there.
    ok = lab.submit("#!/bin/bash\ntrue\n", "-w", "node1", "-o", "/dev/null")
    assert lab.wait_job(ok, timeout=60)["JobState"] == "COMPLETED"
