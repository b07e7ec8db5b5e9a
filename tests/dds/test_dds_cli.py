"""``guardctl dds serve`` and ``guardctl dds status`` as an operator runs them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from dds_helpers import ServiceProcess

from guardctl.config import load_settings
from guardctl.dds import Client


def guardctl(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    env["GUARDCTL_STORE"] = str(store)
    return subprocess.run(
        [sys.executable, "-m", "guardctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_shows_progress_workers_and_leases(
    start_service: Callable[..., ServiceProcess],
) -> None:
    service = start_service("6001", "--records", "1000", "--shard-size", "100", lease_s=30)
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    fast = Client(service.job, worker="fast", settings=settings)
    for _ in range(3):
        shard = fast.lease()
        assert shard is not None and fast.ack(shard)
    held = fast.lease()
    assert held is not None
    status = json.loads(guardctl(service.store, "dds", "status", "6001", "--json").stdout)
    assert status["mode"] == "pull" and status["epoch"] == 0 and not status["finished"]
    assert status["progress"]["epoch_shards_done"] == 3
    assert status["leases"]["in_flight"] == 1
    assert status["workers"][0]["worker"] == "fast" and status["workers"][0]["shards_done"] == 3
    assert status["address"].endswith(str(service.address()[1]))  # type: ignore[index]
    service.kill()  # status reads the database: it works with the service down
    table = guardctl(service.store, "dds", "status", "6001")
    assert table.returncode == 0 and "3/10 shards of this epoch done" in table.stdout
    assert "fast" in table.stdout


def test_operator_errors_are_one_line_with_their_exit_code(tmp_path: Path) -> None:
    missing = guardctl(tmp_path, "dds", "status", "404")
    assert missing.returncode == 8 and missing.stderr.startswith("guardctl: error: job 404 has")
    assert guardctl(tmp_path, "dds", "status", "../x").returncode == 2
    both = guardctl(tmp_path, "dds", "serve", "--job", "1", "--records", "5", "--files", "f")
    assert both.returncode == 2 and "not both" in both.stderr
    assert guardctl(tmp_path, "dds", "serve", "--records", "5").returncode == 2  # no job id
    nothing = guardctl(tmp_path, "dds", "serve", "--job", "9")
    assert nothing.returncode == 2 and "no data-sharding state" in nothing.stderr
    bad = tmp_path / "files.txt"
    bad.write_text("12 a.bin\nlots b.bin\n")
    listed = guardctl(tmp_path, "dds", "serve", "--job", "9", "--files", str(bad))
    assert listed.returncode == 7 and "files.txt:2" in listed.stderr
    for result in (missing, both, nothing, listed):
        assert len(result.stderr.strip().splitlines()) == 1


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    files = tmp_path / "files.txt"
    files.write_text("100 a.bin\n250 b.bin\n350 total\n")
    result = guardctl(tmp_path, "dds", "serve", "--job", "7", "--files", str(files), "--dry-run")
    assert result.returncode == 0 and "'records': 350" in result.stdout
    assert not (tmp_path / "dds").exists()


def test_a_restart_with_another_dataset_is_refused(
    start_service: Callable[..., ServiceProcess],
) -> None:
    service = start_service("6002", "--records", "1000", "--shard-size", "100")
    service.stop()
    other = guardctl(service.store, "dds", "serve", "--job", "6002", "--records", "999")
    assert other.returncode == 2 and "different dataset" in other.stderr


def test_a_second_service_for_the_same_job_is_refused(
    start_service: Callable[..., ServiceProcess],
) -> None:
    service = start_service("6003", "--records", "1000", "--shard-size", "100")
    second = guardctl(service.store, "dds", "serve", "--job", "6003")
    assert second.returncode == 6 and "already running" in second.stderr
    assert service.proc is not None and service.proc.poll() is None


def test_status_of_a_per_step_job_shows_steps_and_shares(
    start_service: Callable[..., ServiceProcess],
) -> None:
    service = start_service(
        "6004", "--records", "1000", "--shard-size", "50", "--global-batch", "100"
    )
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    ranks = [
        Client(service.job, worker=f"r{r}", rank=r, world=2, settings=settings, prefetch=False)
        for r in range(2)
    ]
    for step in range(3):
        for rank, client in enumerate(ranks):
            assert client.next_batch(step, compute_s=0.01 * (1 + 3 * rank)) is not None
    status = json.loads(guardctl(service.store, "dds", "status", "6004", "--json").stdout)
    assert status["mode"] == "step" and status["steps"]["last_split"] == 2
    assert status["progress"]["epoch_steps_done"] == 3 and status["steps"]["steps_per_epoch"] == 10
    assert status["steps"]["shares"] == [80, 20]  # rank 1 reported 4x the time for its part
    assert [w["share"] for w in status["workers"]] == [0.8, 0.2]
    table = guardctl(service.store, "dds", "status", "6004").stdout
    assert "3/10 steps of this epoch done" in table


def test_serve_logs_details_to_the_job_log_and_one_line_to_the_terminal(tmp_path: Path) -> None:
    """What the service logs (a fault with its traceback, a thread that dies) goes whole to
    service.log; the terminal gets one line per record and never a traceback."""
    log = tmp_path / "service.log"
    code = f"""
import logging, threading
from pathlib import Path
from guardctl.dds.logs import log_to
log_to(Path({str(log)!r}))
log = logging.getLogger("guardctl.dds")
try:
    {{}}["missing"]
except KeyError:
    log.exception("request POST /v1/lease failed")
def die():
    raise RuntimeError("the checkpointer's disk went away")
thread = threading.Thread(target=die, name="dds-checkpoint")
thread.start()
thread.join()
log.info("for the file only")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        "guardctl dds: error: request POST /v1/lease failed (KeyError: 'missing')",
        "guardctl dds: error: dds-checkpoint stopped on an error "
        "(RuntimeError: the checkpointer's disk went away)",
    ]
    text = log.read_text()
    assert text.count("Traceback") == 2 and "for the file only" in text


def test_serve_on_a_taken_port_exits_8_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = guardctl(
            tmp_path,
            "--set",
            "dds.bind=127.0.0.1",
            "--set",
            f"dds.port={port}",
            "dds",
            "serve",
            "--job",
            "6100",
            "--records",
            "10",
        )
    assert done.returncode == 8
    [line] = done.stderr.splitlines()
    assert line.startswith(f"guardctl: error: cannot listen on 127.0.0.1:{port}: ")
    assert line.endswith("address already in use")
    assert "Traceback" not in done.stderr
    log = (tmp_path / "dds" / "6100" / "service.log").read_text()
    assert "the service stopped: cannot listen" in log
