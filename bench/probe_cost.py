"""What the training-job probe costs per step, against an empty loop, measured in one run.

Three loops of the same length:

- ``empty``: ``for _ in range(n): pass``;
- ``probe``: ``with probe.step(): probe.comm_begin()`` per iteration, the flush
  thread writing to a temporary store every second (as in a training job);
- the same, with the CPU time of the whole process (flush thread included)
  divided by the steps: what the probe takes from the machine, not only from
  the training loop.

    python bench/probe_cost.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

TARGET_US = 10.0  # "microseconds per step"


def empty_loop(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        pass
    return time.perf_counter() - start


def probe_loop(n: int) -> tuple[float, float, dict[str, int]]:
    from guardctl import probe

    with tempfile.TemporaryDirectory() as store:
        p = probe.configure(store=store, job="bench", rank=0, node="bench01", queue_size=n + 1)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            with probe.step():
                probe.comm_begin()
        wall = time.perf_counter() - wall0
        probe.flush()
        cpu = time.process_time() - cpu0
        stats = p.stats()
    return wall, cpu, stats


def measure(n: int) -> dict[str, Any]:
    empty_loop(n // 10)  # warm up
    empty = min(empty_loop(n) for _ in range(3))
    wall, cpu, stats = probe_loop(n)
    return {
        "steps": n,
        "empty_ns_per_step": empty / n * 1e9,
        "probe_ns_per_step": wall / n * 1e9,
        "probe_overhead_ns_per_step": (wall - empty) / n * 1e9,
        "probe_vs_empty": wall / empty,
        "process_cpu_us_per_step": cpu / n * 1e6,
        "written": stats["written"],
        "dropped": stats["dropped"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (for CI)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    result = measure(100_000 if args.quick else 1_000_000)
    result["within_target"] = result["process_cpu_us_per_step"] < TARGET_US
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"probe, {result['steps']} steps")
        print(
            f"  training loop: empty {result['empty_ns_per_step']:.0f} ns/step, with probe "
            f"{result['probe_ns_per_step']:.0f} ns/step "
            f"(+{result['probe_overhead_ns_per_step']:.0f} ns)"
        )
        print(
            f"  whole process incl. writing: {result['process_cpu_us_per_step']:.2f} us CPU/step "
            f"(target < {TARGET_US:g} us); written {result['written']}, "
            f"dropped {result['dropped']}"
        )
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
