"""The local Slurm lab (slurm/lab/up.sh, down.sh) and its fixtures work."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from labtools import DOWN_SH, MARKER_PREFIX, UP_SH, Lab, find_free_port_base


def test_four_nodes_idle(lab: Lab) -> None:
    assert lab.nodes == ["node1", "node2", "node3", "node4"]
    assert lab.states() == {n: "idle" for n in lab.nodes}
    node = lab.node_state("node2")
    assert node["name"] == "node2"
    assert node["state"] == "idle"
    assert node["cpus"] >= 1
    assert lab.env["SLURM_CONF"] == str(lab.conf)
    assert lab.conf.read_text().startswith(MARKER_PREFIX)
    ping = lab.sh("scontrol", "ping")
    assert "UP" in ping.stdout
    with pytest.raises(KeyError):
        lab.node_state("node99")


def test_job_runs_on_chosen_node(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "where"
    job = lab.submit(
        f'#!/bin/bash\necho "$SLURMD_NODENAME $SLURM_SUBMIT_DIR" > {out}\n',
        "-w",
        "node3",
        "-o",
        "/dev/null",
        cwd=tmp_path,
    )
    info = lab.wait_job(job, timeout=60)
    assert info["JobState"] == "COMPLETED", info
    assert info["NodeList"] == "node3"
    assert out.read_text().split() == ["node3", str(tmp_path)]


def test_drain_resume_round_trip(lab: Lab) -> None:
    # DRAIN without a reason is refused.
    refused = lab.sh("scontrol", "update", "NodeName=node2", "State=DRAIN", check=False)
    assert refused.returncode != 0
    lab.sh("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=lab test")
    lab.wait_states({"node2": "drained"}, timeout=10)
    node = lab.node_state("node2")
    assert "DRAIN" in node["state_flags"]
    assert node["reason"] == "lab test"
    assert lab.states()["node1"] == "idle"
    # A drained node gets no jobs.
    job = lab.submit("#!/bin/bash\ntrue\n", "-w", "node2", "-o", "/dev/null")
    time.sleep(1)
    assert lab.job_info(job)["JobState"] == "PENDING"
    lab.sh("scancel", job)
    lab.sh("scontrol", "update", "NodeName=node2", "State=RESUME")
    lab.wait_idle(["node2"], timeout=30)
    assert lab.node_state("node2")["state_flags"] == []
    # RESUME of an idle node is an error (rc 1) in 22.05.
    assert lab.sh("scontrol", "update", "NodeName=node2", "State=RESUME", check=False).returncode


def test_reset_cleans_up(slurm_lab: Lab) -> None:
    lab = slurm_lab
    lab.reset()
    lab.sh("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=dirty")
    lab.sh("scontrol", "update", "NodeName=node4", "State=DOWN", "Reason=dirty")
    lab.submit("#!/bin/bash\nsleep 600\n", "-w", "node2", "-o", "/dev/null")
    lab.sh(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=labtest",
        "Nodes=node3",
        "StartTime=now",
        "Duration=60",
        "Users=root",
        "Flags=MAINT",
    )
    lab.stop_slurmd("node3")
    lab.reset()
    assert lab.states() == {n: "idle" for n in lab.nodes}
    assert lab.sh("squeue", "-h").stdout.strip() == ""
    assert "labtest" not in lab.sh("scontrol", "show", "reservation", check=False).stdout
    assert all(lab.slurmd_pid(n) for n in lab.nodes)


def test_up_is_idempotent(lab: Lab) -> None:
    pids = [lab.controller_pid()] + [lab.slurmd_pid(n) for n in lab.nodes]
    proc = lab.up()
    assert "already up" in proc.stderr
    bin_dir = lab.bin_dir or Path(shutil.which("sinfo") or "/usr/bin/sinfo").parent
    assert proc.stdout.splitlines() == [f"SLURM_CONF={lab.conf}", f"SLURM_BIN_DIR={bin_dir}"]
    assert [lab.controller_pid()] + [lab.slurmd_pid(n) for n in lab.nodes] == pids


def test_controller_stop_start(lab: Lab) -> None:
    lab.stop_controller()
    assert not lab.controller_running()
    assert all(lab.slurmd_pid(n) for n in lab.nodes)  # only the controller stopped
    down = lab.sh("sinfo", check=False, timeout=60)
    assert down.returncode != 0
    lab.start_controller()
    assert lab.controller_running()
    lab.wait_idle(timeout=30)


def _write_foreign(path: Path) -> bytes:
    content = b"# a real cluster's config\nClusterName=prod\nSlurmctldHost=head1\n"
    path.write_bytes(content)
    return content


def test_up_refuses_foreign_conf(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    content = _write_foreign(conf)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.run(
        ["bash", str(UP_SH), "--dir", str(tmp_path), "--port", str(find_free_port_base(5))],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 3, proc.stderr
    assert "refusing" in proc.stderr
    assert conf.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # down.sh refuses to touch it too.
    proc = subprocess.run(
        ["bash", str(DOWN_SH), "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 3, proc.stderr
    assert conf.read_bytes() == content


def test_print_conf_options(tmp_path: Path) -> None:
    extra = tmp_path / "extra.conf"
    extra.write_text("DebugFlags=Gres\n")
    proc = subprocess.run(
        [
            "bash",
            str(UP_SH),
            "--print-conf",
            "--dir",
            str(tmp_path),
            "--nodes",
            "3",
            "--port",
            "23000",
            "--cluster",
            "labx",
            "--prolog",
            "/bin/true",
            "--epilog",
            "/bin/true",
            "--health-check",
            "/bin/true",
            "--health-interval",
            "7",
            "--conf-extra",
            str(extra),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(MARKER_PREFIX)
    for want in (
        "ClusterName=labx",
        "SlurmctldPort=23000",
        "Prolog=/bin/true",
        "Epilog=/bin/true",
        "HealthCheckProgram=/bin/true",
        "HealthCheckInterval=7",
        "DebugFlags=Gres",
        f"StateSaveLocation={tmp_path}/state",
    ):
        assert want in lines, want
    assert any(
        line.startswith("NodeName=node[1-3] ") and "Port=23001-23003" in line for line in lines
    )
    assert not (tmp_path / "slurm.conf").exists()
    bad = subprocess.run(
        ["bash", str(UP_SH), "--print-conf", "--nodes", "zero"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2


def _lab_processes(lab: Lab) -> list[int]:
    """Pids of live processes whose environment names this lab's SLURM_CONF."""
    pids = []
    needle = f"SLURM_CONF={lab.conf}".encode()
    for env in Path("/proc").glob("[0-9]*/environ"):
        pid = int(env.parent.name)
        if pid == os.getpid():
            continue
        try:
            if needle in env.read_bytes().split(b"\0"):
                state = (env.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(pid)
        except OSError:
            continue
    return pids


def test_second_lab_and_down_idempotent(
    slurm_lab: Lab, lab_factory: Callable[..., Lab], tmp_path: Path
) -> None:
    """A second lab runs beside the session's lab; down.sh stops exactly it,
    jobs included, and is idempotent; the session lab is unaffected."""
    prolog = tmp_path / "prolog.sh"
    marker = tmp_path / "prolog-ran"
    prolog.write_text(f'#!/bin/bash\necho "$SLURMD_NODENAME" >> {marker}\n')
    prolog.chmod(0o755)
    other = lab_factory(nodes=2, up_args=["--prolog", str(prolog)])
    assert other.port != slurm_lab.port and other.dir != slurm_lab.dir
    assert other.states() == {"node1": "idle", "node2": "idle"}
    job = other.submit("#!/bin/bash\nsleep 600\n", "-w", "node2", "-o", "/dev/null")
    deadline = time.monotonic() + 30
    while other.job_info(job)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, other.job_info(job)
        time.sleep(0.2)
    # The job is RUNNING once slurmctld has allocated it; slurmd runs the prolog beside
    # that, so its mark may come a moment later (on a slow machine, after the state).
    while not marker.exists() or not marker.read_text().endswith("\n"):
        assert time.monotonic() < deadline, "the prolog never ran"
        time.sleep(0.2)
    assert marker.read_text().split() == ["node2"]
    ctld_pid = other.controller_pid()
    slurmd_pids = [other.slurmd_pid(n) for n in other.nodes]
    assert ctld_pid and all(slurmd_pids)
    assert _lab_processes(other)

    first = other.down()
    assert first.returncode == 0
    assert other.controller_pid() is None
    assert not any(other.slurmd_pid(n) for n in other.nodes)
    for pid in [ctld_pid, *slurmd_pids]:
        assert (
            not Path(f"/proc/{pid}/cmdline").exists()
            or not Path(f"/proc/{pid}/cmdline").read_bytes()
        ), pid
    assert _lab_processes(other) == []
    second = other.down()
    assert second.returncode == 0
    assert slurm_lab.controller_running()
    assert slurm_lab.sh("sinfo", "-h").returncode == 0


def test_unavailable_lab_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    # Load this folder's conftest by path: other folders' conftest modules share its name.
    import importlib.util

    here = Path(__file__).with_name("conftest.py")
    spec = importlib.util.spec_from_file_location("lab_conftest", here)
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    monkeypatch.setattr(conftest, "lab_unavailable_reason", lambda: "no Slurm here")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Slurm here"):
        conftest._require_lab()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        conftest._require_lab()
