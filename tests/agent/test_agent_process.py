"""The agent as a real process: --once, SIGTERM, SIGKILL mid-run, and a store that fills up."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import SYSFS_IB2, SYSFS_IB8

from guardctl.storage import layout
from guardctl.storage import store as shared_store
from guardctl.telemetry.schema import read_path


def agent_argv(
    store: Path, status: Path | str = "", sysfs: Path = SYSFS_IB8, *extra: str
) -> list[str]:
    shared_store.init(store)  # what the administrator does once, with the store mounted
    return [
        sys.executable,
        "-m",
        "guardctl",
        "--set",
        f"agent.sysfs_root={sysfs}",
        "--set",
        f'agent.status_file="{status}"',
        "--set",
        "agent.status_every=1",
        "--set",
        "agent.write_interval_s=0",  # every sample, as the tests' timings expect
        "--set",
        f'agent.handoff_socket="{store.parent / "agent.sock"}"',  # never the machine's own
        "agent",
        "--store",
        str(store),
        "--node",
        "node1",
        *extra,
    ]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GUARDCTL_")}


def start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_once_json_reports_each_collector(tmp_path: Path) -> None:
    proc = subprocess.run(
        agent_argv(tmp_path, "", SYSFS_IB2, "--once", "--json"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    by_name = {c["name"]: c for c in status["collectors"]}
    assert set(by_name) == {"nvml", "host", "infiniband"}
    assert by_name["host"]["state"] == "ok" and by_name["infiniband"]["records"] == 2
    if by_name["nvml"]["state"] == "unavailable":  # this machine has no NVIDIA driver
        assert "no NVIDIA driver" in proc.stderr
    # each collector's records, and one health record (kind "agent") per collector
    assert status["store"]["written"] == sum(c["records"] + 1 for c in by_name.values())
    assert read_path(tmp_path).bad_total == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--interval", "0.5"], "between 1 and 10"), (["--json"], "--json needs --once")],
)
def test_bad_options_are_one_line_exit_2(tmp_path: Path, extra: list[str], message: str) -> None:
    proc = subprocess.run(
        agent_argv(tmp_path, "", SYSFS_IB2, *extra),
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("guardctl: error:") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_once_into_an_unwritable_store_exits_8(tmp_path: Path) -> None:
    argv = agent_argv(tmp_path / "store", "", SYSFS_IB2, "--once")
    telemetry = tmp_path / "store" / "telemetry"
    telemetry.rmdir()  # laid out by `guardctl store init`: a file in its place cannot be written
    telemetry.write_text("not a directory\n")
    proc = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 8
    assert "store unwritable" in proc.stderr and "ENOTDIR" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("guardctl: error: store not written")


def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    proc = start(agent_argv(tmp_path / "store", status, SYSFS_IB2, "--interval", "1"))
    deadline = time.monotonic() + 20
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "agent stopping after" in err
    assert json.loads(status.read_text())["samples"] >= 1


def _wait_clear_of_hour_end(margin_s: float) -> None:
    # A torn tail planted in this hour's file must be the file the agent appends to next.
    left = 3600 - time.time() % 3600
    if left < margin_s:
        time.sleep(left + 0.5)


def test_sigkill_mid_run_leaves_nothing_torn(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rng = random.Random(7)
    for _ in range(3):
        before = _bytes_in(store)
        proc = start(agent_argv(store, "", SYSFS_IB8, "--interval", "1"))
        # Killed at a random moment once this run is sampling (a busy machine may be slow to
        # start it; the files of the run before are there already).
        assert _wait_for(lambda: _bytes_in(store) > before, 30)  # noqa: B023 (called here)
        time.sleep(rng.uniform(1.0, 2.0))
        proc.kill()
        proc.communicate(timeout=20)
    # What a kill inside write() can leave: half a line at the end of the file.
    _wait_clear_of_hour_end(30)
    current = layout.node_telemetry_file(store, "node1", time.time())
    current.parent.mkdir(parents=True, exist_ok=True)
    fragment = b'{"v":1,"kind":"nic","ts":1796040000.0,"node":"node1","dev'
    with current.open("ab") as fh:
        fh.write(fragment)
    planted = current.stat().st_size
    proc = start(agent_argv(store, "", SYSFS_IB8, "--interval", "1"))
    # Killed only once it has appended to that file (the machine may be slow to start it).
    assert _wait_for(lambda: current.stat().st_size > planted, 30)
    proc.kill()
    proc.communicate(timeout=20)
    assert fragment not in current.read_bytes()
    result = read_path(store)
    assert result.bad_total == 0, result.bad
    stamps = [r["ts"] for r in result.records]
    assert stamps == sorted(stamps)
    samples = sorted(set(stamps))
    assert len(samples) >= 4  # each of the four runs wrote at least one
    # every sample is whole: host + 8 ports + the health of 3 collectors
    assert all(stamps.count(ts) == 12 for ts in samples)


def _bytes_in(store: Path) -> int:
    return sum(p.stat().st_size for p in store.rglob("*.jsonl"))


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    where.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_full_store_keeps_sampling_and_resumes(tmp_path: Path) -> None:
    status = tmp_path / "status.json"

    def store_state() -> dict[str, Any]:
        try:
            return json.loads(status.read_text())["store"]
        except (OSError, ValueError):
            return {}

    with small_tmpfs(tmp_path / "store") as store:
        proc = start(agent_argv(store, status, SYSFS_IB8, "--interval", "1"))
        try:
            assert _wait_for(lambda: store_state().get("written", 0) >= 9, 20)
            _fill(store / "filler")  # the disk is full now
            assert _wait_for(lambda: store_state().get("buffered", 0) >= 18, 20)
            assert not store_state()["writable"]
            assert "ENOSPC" in str(store_state()["error"])
            (store / "filler").unlink()  # space again
            assert _wait_for(lambda: store_state().get("writable") is True, 20)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert err.count("store unwritable") == 1 and "ENOSPC" in err
        assert err.count("writable again") == 1 and "0 records dropped" in err
        final = json.loads(status.read_text())
        result = read_path(store / "telemetry")
    assert result.bad_total == 0
    stamps = [r["ts"] for r in result.records]
    assert stamps == sorted(stamps)  # the backlog went first, in order
    assert len(set(stamps)) == final["samples"]  # no sample lost
    assert final["store"]["dropped"] == 0


def test_once_leaves_the_running_agents_status_file_alone(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    status.write_text('{"node": "node1", "samples": 4242}\n')  # the running agent's
    argv = agent_argv(tmp_path / "store", status, SYSFS_IB2, "--once", "--json")
    proc = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["samples"] == 1  # its own status, printed
    assert json.loads(status.read_text())["samples"] == 4242


def test_unknown_collector_is_a_config_error(tmp_path: Path) -> None:
    argv = agent_argv(tmp_path, "", SYSFS_IB2, "--once")
    argv[3:3] = ["--set", 'agent.collectors=["host", "dcgm"]']
    proc = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert "unknown collector 'dcgm'" in proc.stderr
