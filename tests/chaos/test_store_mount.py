"""A shared store that is not mounted: its mount point is an empty local directory, and every
writer (the node agent, the controller, node actions, sweeps) must refuse it rather than fill
the local disk with telemetry, a lease and an action log of its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from storetools import agent_files

from guardctl.agent.daemon import Agent
from guardctl.storage import layout, store

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "agent"))
from agent_helpers import settings as agent_settings  # noqa: E402

TS = 1_796_040_000.0  # 2026-11-30T12:00:00Z


def guardctl(*args: str, store_root: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARDCTL_")}
    if store_root is not None:
        env["GUARDCTL_STORE"] = str(store_root)
    env["SLURM_CONF"] = "/nonexistent/slurm.conf"  # no Slurm is needed to refuse
    return subprocess.run(
        [sys.executable, "-m", "guardctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(proc: subprocess.CompletedProcess[str], root: Path) -> None:
    assert proc.returncode == 8, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"guardctl: error: store {root} is not guardctl's shared store: .guardctl-store is missing"
    ), line


@pytest.mark.parametrize(
    "command",
    [
        ["agent", "--once", "--set-store"],
        ["control", "--once"],
        ["drain", "node1", "--reason", "x"],
        ["quarantine", "node1", "--reason", "x"],
        ["sweep", "node1"],
        ["qualify"],
    ],
)
def test_every_writer_refuses_an_unmounted_store(tmp_path: Path, command: list[str]) -> None:
    root = tmp_path / "mnt" / "guardctl"
    root.mkdir(parents=True)  # the mount point, with nothing mounted on it
    if command[-1] == "--set-store":
        command = [*command[:-1], "--store", str(root)]
    refused(guardctl(*command, store_root=root), root)
    assert list(root.iterdir()) == []  # nothing was written on the local disk


def test_the_agent_does_not_create_a_missing_store(tmp_path: Path) -> None:
    root = tmp_path / "not-mounted"
    refused(guardctl("agent", "--once", "--store", str(root)), root)
    assert not root.exists()


@pytest.mark.skipif(Path("/etc/guardctl").exists(), reason="this host has a guardctl config")
def test_the_default_store_root_is_refused_with_what_to_set() -> None:
    proc = guardctl("agent", "--once")
    assert proc.returncode == 8
    assert "store.root is not set and the default is a local directory" in proc.stderr
    assert "set [store] root or GUARDCTL_STORE" in proc.stderr


def test_store_init_marks_the_store_for_the_agent(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    proc = guardctl("store", "init", str(root))
    assert proc.returncode == 0, proc.stderr
    assert (root / ".guardctl-store").is_file()
    proc = guardctl(
        "--set",
        f"agent.sysfs_root={REPO}/tests/fixtures/sysfs/ib2",
        "--set",
        'agent.status_file=""',
        "agent",
        "--once",
        "--store",
        str(root),
        "--node",
        "node1",
    )
    assert proc.returncode == 0, proc.stderr
    assert agent_files(root, "node1")


@contextlib.contextmanager
def bind_mount(source: Path, target: Path) -> Iterator[None]:
    proc = subprocess.run(
        ["mount", "--bind", str(source), str(target)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {proc.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_a_running_agent_buffers_while_the_store_is_unmounted(tmp_path: Path) -> None:
    server = tmp_path / "server"  # what the file server exports
    store.init(server)
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    agent = Agent(agent_settings(collectors=("host",)), mount_point, "node1")
    with bind_mount(server, mount_point):
        assert agent.sample(TS)
    # The filesystem went away under the running agent: its mount point is local disk now.
    assert not agent.sample(TS + 1)
    state = agent.status()["store"]
    assert not state["writable"] and state["buffered"] == 2
    assert "is not guardctl's shared store" in state["error"]
    assert list(mount_point.iterdir()) == []  # nothing written on the local disk
    with bind_mount(server, mount_point):  # back: the backlog goes to the shared store
        assert agent.sample(TS + 2)
        agent.close()
    records = agent_files(server, "node1")
    lines = [line for path in records for line in path.read_text().splitlines()]
    assert len(lines) == 6  # three samples of one collector and its health record
    assert layout.node_telemetry_file(server, "node1", TS).is_file()


@pytest.mark.parametrize(
    "unit", ["guardctl-agent.service", "guardctl-control.service", "guardctl-control-once.service"]
)
def test_the_units_require_the_store_mount(unit: str) -> None:
    text = (REPO / "contrib" / unit).read_text()
    section = text.split("[Unit]", 1)[1].split("[Service]", 1)[0]
    assert any(line.startswith("RequiresMountsFor=/") for line in section.splitlines())


def test_the_controller_daemon_skips_passes_while_the_store_is_unmounted(tmp_path: Path) -> None:
    from guardctl.config import load_settings
    from guardctl.controller.loop import Controller, serve
    from guardctl.slurm.memory import MemorySlurm

    server = tmp_path / "server"
    store.init(server)
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    slurm = MemorySlurm(["node1", "node2", "node3", "node4"])
    with bind_mount(server, mount_point):
        settings = load_settings(environ={"GUARDCTL_STORE": str(mount_point)})
        controller = Controller(settings, act=True, slurm=slurm)
    said: list[str] = []

    def warn(line: str) -> None:
        said.append(line)
        raise SystemExit(0)  # one pass is enough to see what the daemon does

    def emit(report: object) -> None:
        raise AssertionError(f"a pass ran on an unmounted store: {report}")

    with pytest.raises(SystemExit):
        serve(controller, 60.0, emit, warn)
    assert len(said) == 1 and said[0].startswith("pass failed, the next one carries on: store ")
    assert "is not guardctl's shared store" in said[0]
    assert list(mount_point.iterdir()) == []  # no lease, no action log on the local disk
    assert slurm.reservations() == [] and not any(n.drained for n in slurm.nodes())
