"""Exactly-once completion with real processes: workers and the service itself SIGKILLed."""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from dds_helpers import ServiceProcess, done_counts


def _logged(paths: list[Path]) -> list[tuple[int, int]]:
    out = []
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.endswith("}"):  # a SIGKILL may cut the last line short
                    record = json.loads(line)
                    out.append((record["epoch"], record["shard"]))
    return out


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    return proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""


def _expired_leases(service: ServiceProcess) -> int:
    with service.db() as conn:
        return int(conn.execute("SELECT COUNT(*) FROM lease WHERE state = 'expired'").fetchone()[0])


def test_every_shard_once_while_workers_are_killed_and_new_ones_join(
    start_service: Callable[..., ServiceProcess], tmp_path: Path
) -> None:
    shards, epochs = 120, 2
    service = start_service(
        "2001",
        "--records",
        str(shards * 50),
        "--shard-size",
        "50",
        "--epochs",
        str(epochs),
        lease_s=1.0,
    )
    rng = random.Random(20261130)
    logs: list[Path] = []

    def spawn() -> subprocess.Popen[bytes]:
        logs.append(tmp_path / f"worker{len(logs)}.jsonl")
        return service.worker("--sample-ms", "2", log=logs[-1])  # 100 ms per shard

    workers = [spawn() for _ in range(4)]
    kills = 0
    deadline = time.monotonic() + 120
    while any(w.poll() is None for w in workers) and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.3, 0.7))
        alive = [w for w in workers if w.poll() is None]
        if kills < 6 and len(alive) > 1:
            rng.choice(alive).kill()  # SIGKILL, most likely in the middle of a shard
            kills += 1
            workers.append(spawn())
    for worker in workers:
        worker.wait(timeout=60)
    assert kills == 6
    counts = done_counts(service)
    assert len(counts) == shards * epochs, "a shard was lost"
    assert set(counts.values()) == {1}, "a shard was completed twice"
    assert _expired_leases(service) >= 1, "no lease of a killed worker ever expired"
    logged = _logged(logs)
    assert len(logged) == len(set(logged)), "two workers were both told their completion counted"
    assert set(logged) <= set(counts)


def test_nothing_lost_or_doubled_when_the_service_is_killed_and_restarted(
    start_service: Callable[..., ServiceProcess], tmp_path: Path
) -> None:
    shards = 600
    service = start_service(
        "2002", "--records", str(shards * 20), "--shard-size", "20", lease_s=3.0
    )
    logs = [tmp_path / f"worker{i}.jsonl" for i in range(4)]
    workers = [service.worker("--sample-ms", "1", log=log) for log in logs]  # 20 ms per shard
    rng = random.Random(4242)
    restarts: list[float] = []
    for _ in range(4):
        time.sleep(rng.uniform(0.3, 0.9))
        if all(w.poll() is not None for w in workers):
            break
        service.kill()
        started = time.monotonic()
        service.start(with_dataset=False)  # resumes from its database alone
        restarts.append(time.monotonic() - started)
    for worker in workers:
        assert worker.wait(timeout=120) == 0, _stderr(worker)
    assert len(restarts) == 4, "the workers finished before the service was killed 4 times"
    assert max(restarts) < 5.0, f"restart took {max(restarts):.1f} s"
    counts = done_counts(service)
    assert len(counts) == shards and set(counts.values()) == {1}
    # The workers were not killed, so their logs are complete: each shard counted exactly once.
    logged = _logged(logs)
    assert sorted(logged) == sorted(counts)
