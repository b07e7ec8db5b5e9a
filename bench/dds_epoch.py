#!/usr/bin/env python3
"""Benchmark: one epoch of a simulated 16-worker job with one 4x-slower worker.

Three ways to share the data, each timed over the same dataset:

* static: equal shards fixed up front (a DistributedSampler), synchronous steps
  (each step waits for the slowest rank, as an all-reduce does);
* pull: the real service's pull mode, workers lease shards as they go;
* per-step: the real service's per-step mode, synchronous steps whose global
  batch is split by the speeds the service has measured.

"Training" a sample is a sleep (0.2 ms, 0.8 ms on the slow worker), so the
figures measure the sharding, not the machine's two cores. The ratio of each
mode's epoch time to static's, measured in the same run, is the result;
AntDT reports more than 3x.

    python3 bench/dds_epoch.py            # 160 000 samples
    python3 bench/dds_epoch.py --quick    # 48 000 samples, for CI
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from guardctl.config import load_settings
from guardctl.dds import Client

WORKERS = 16
FAST_S = 0.0002  # per sample
SLOW_FACTOR = 4.0


def per_sample(rank: int) -> float:
    return FAST_S * (SLOW_FACTOR if rank == WORKERS - 1 else 1.0)


def work(samples: int, rank: int) -> float:
    """Process *samples* samples; return the compute time."""
    started = time.perf_counter()
    time.sleep(samples * per_sample(rank))
    return time.perf_counter() - started


def static_epoch(records: int, batch: int) -> float:
    """Equal shares of every global batch, synchronous steps."""
    barrier = threading.Barrier(WORKERS)
    steps = -(-records // batch)

    def rank_loop(rank: int) -> None:
        for step in range(steps):
            size = min(batch, records - step * batch)
            share = size // WORKERS + (1 if rank < size % WORKERS else 0)
            work(share, rank)
            barrier.wait()

    return _run_threads(rank_loop)


def pull_epoch(store: Path, job: str) -> float:
    def rank_loop(rank: int) -> None:
        client = _client(store, job, rank)
        while (shard := client.lease()) is not None:
            work(len(shard), rank)
            assert client.ack(shard)
        client.close()

    return _run_threads(rank_loop)


def step_epoch(store: Path, job: str) -> tuple[float, list[int]]:
    barrier = threading.Barrier(WORKERS)
    last_shares: list[int] = [0] * WORKERS

    def rank_loop(rank: int) -> None:
        client = _client(store, job, rank)
        step, compute_s = 0, None
        while (batch := client.next_batch(step, compute_s=compute_s)) is not None:
            compute_s = work(batch.share, rank)
            last_shares[rank] = batch.share
            barrier.wait()  # the all-reduce
            step += 1
        client.close()

    return _run_threads(rank_loop), last_shares


def _client(store: Path, job: str, rank: int) -> Client:
    settings = load_settings(assignments=(f"store.root={store}",), environ={})
    return Client(job, worker=f"rank{rank}", rank=rank, world=WORKERS, settings=settings)


def _run_threads(target: Any) -> float:
    threads = [threading.Thread(target=target, args=(r,)) for r in range(WORKERS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def serve(store: Path, job: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GUARDCTL_STORE": str(store)}
    argv = [
        sys.executable,
        "-m",
        "guardctl",
        "--set",
        "dds.bind=127.0.0.1",
        "dds",
        "serve",
        "--job",
        job,
        *args,
    ]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    address = store / "dds" / job / "address.json"
    while not address.exists():
        if proc.poll() is not None:
            raise SystemExit("the service did not start")
        time.sleep(0.05)
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller epoch (CI)")
    parser.add_argument("--shard-size", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=2048)
    args = parser.parse_args()
    records = 48_000 if args.quick else 160_000
    ideal = SLOW_FACTOR * (WORKERS - 1 + 1 / SLOW_FACTOR) / WORKERS
    result: dict[str, Any] = {
        "workers": WORKERS,
        "slow_workers": 1,
        "slow_factor": SLOW_FACTOR,
        "records": records,
        "shard_size": args.shard_size,
        "global_batch": args.global_batch,
        "ideal_speedup": round(ideal, 2),
    }
    result["static_s"] = round(static_epoch(records, args.global_batch), 3)
    with tempfile.TemporaryDirectory(prefix="dds-epoch-") as tmp:
        store = Path(tmp)
        proc = serve(store, "pull", "--records", str(records), "--shard-size", str(args.shard_size))
        try:
            result["pull_s"] = round(pull_epoch(store, "pull"), 3)
        finally:
            proc.terminate()
            proc.wait()
        proc = serve(
            store,
            "step",
            "--records",
            str(records),
            "--shard-size",
            str(args.shard_size),
            "--global-batch",
            str(args.global_batch),
        )
        try:
            seconds, shares = step_epoch(store, "step")
            result["per_step_s"] = round(seconds, 3)
            result["per_step_last_shares"] = shares
        finally:
            proc.terminate()
            proc.wait()
    result["pull_speedup"] = round(result["static_s"] / result["pull_s"], 2)
    result["per_step_speedup"] = round(result["static_s"] / result["per_step_s"], 2)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
