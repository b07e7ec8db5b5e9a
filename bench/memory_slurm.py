#!/usr/bin/env python3
"""Benchmark of the in-memory Slurm: how one fleet step's cost grows with the fleet.

One "step" is what a controller pass does to the Slurm it drives: read every node, every job and
every reservation, quarantine 1% of the nodes, submit one 4-node job per 10 nodes, finish a third
of them, advance the clock. Timed at several fleet sizes in the same run; the figure that matters
is the ratio of the per-node cost at the largest size to the smallest (1.0: linear; a quadratic
structure would grow it with the fleet).

Usage: python bench/memory_slurm.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest

SIZES = [1000, 4000, 16000]
QUICK = [250, 1000]


def step(nodes: int) -> float:
    slurm = MemorySlurm([f"node{i}" for i in range(1, nodes + 1)])
    started = time.perf_counter()
    ids = [slurm.submit(SubmitRequest("train.sbatch", node_count=4)) for _ in range(nodes // 10)]
    for i in range(1, nodes // 100 + 1):
        slurm.create_reservation(f"guardctl_q_node{i}", [f"node{i}"], ["root"])
    slurm.nodes(), slurm.jobs(), slurm.reservations()
    for job_id in ids[: len(ids) // 3]:
        slurm.finish(job_id)
    slurm.advance(60)
    slurm.nodes(), slurm.jobs(), slurm.reservations()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for size in QUICK if args.quick else SIZES:
        best = min(step(size) for _ in range(3))
        rows.append(
            {"nodes": size, "seconds": round(best, 4), "us_per_node": round(best / size * 1e6, 2)}
        )
    ratio = rows[-1]["us_per_node"] / rows[0]["us_per_node"]
    if args.json:
        print(json.dumps({"rows": rows, "per_node_ratio": round(ratio, 2)}, indent=1))
    else:
        for r in rows:
            print(
                f"{r['nodes']:>6} nodes  {r['seconds']:>8.4f} s  {r['us_per_node']:>7.2f} us/node"
            )
        print(f"per-node cost, largest / smallest fleet: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
