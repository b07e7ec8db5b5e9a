#!/usr/bin/env python3
"""What GPU jobs from Slurm cost the Prometheus source: one pass's mapping with and without them.

One analysis pass's worth of dcgm-exporter series (every GPU series guardctl reads, the
default 900 s at a 30 s scrape) for a fleet of 8-GPU nodes, turned into the analyzer's frame
by the source's own mapping (:func:`guardctl.sources.prometheus.to_frame`, the HTTP part left
out): once without jobs (the baseline), once with ``jobs_from = "slurm"``, every node in one
of the 8-node jobs an in-memory Slurm ran (its ``recent_jobs()`` turned into node runs, timed
with it). The ratio with / without is the figure; the fastest of nine alternating rounds
each, in CPU seconds of this process (the work is single-threaded: on a shared machine its
wall-clock time is mostly the other processes').

Usage: python bench/source_jobs.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from guardctl.sections.source import SourceSettings
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest
from guardctl.sources import dcgm_fields as F
from guardctl.sources.prometheus import to_frame
from guardctl.sources.slurm_jobs import NodeJobs

SIZES = [128, 512]  # nodes (1k and 4k GPUs)
QUICK = [32, 128]
SCRAPE_S, SPAN_S, START = 30.0, 900.0, 1_800_000_000.0
ROUNDS = 9  # alternating, so that a busy moment of a shared machine hits both ways alike


def series(nodes: list[str]) -> dict[str, list[Any]]:
    """Each GPU field's preferred series, every GPU, every scrape (values as Prometheus sends)."""
    stamps = [START + i * SCRAPE_S for i in range(int(SPAN_S / SCRAPE_S))]
    out: dict[str, list[Any]] = {}
    for options in F.GPU_FIELDS.values():
        metric = options[0].metric
        out[metric] = [
            {
                "metric": {"__name__": metric, "Hostname": n, "gpu": str(g)},
                "values": [[t, "1"] for t in stamps],
            }
            for n in nodes
            for g in range(8)
        ]
    return out


def one_pass(matrix: dict[str, list[Any]], jobs_of: MemorySlurm | None) -> float:
    started = time.process_time()
    jobs = NodeJobs.from_jobs(jobs_of.recent_jobs()) if jobs_of is not None else None
    cfg = SourceSettings(jobs_from="slurm" if jobs else "label")
    frame, _ = to_frame(lambda m, stamps: [] if stamps else matrix.get(m, []), cfg, "", jobs)
    assert jobs is None or (frame.cols["gpu"]["job"] >= 0).all()
    return time.process_time() - started


def measure(size: int) -> dict[str, Any]:
    nodes = [f"gn{i:05d}" for i in range(size)]
    slurm = MemorySlurm(nodes, start=START - 60)
    for i in range(0, size, 8):
        slurm.submit(SubmitRequest("train.sbatch", nodes=tuple(nodes[i : i + 8])))
    slurm.advance(SPAN_S + 60)
    matrix = series(nodes)
    pairs = [(one_pass(matrix, None), one_pass(matrix, slurm)) for _ in range(ROUNDS)]
    without, with_jobs = min(p[0] for p in pairs), min(p[1] for p in pairs)
    return {
        "nodes": size,
        "gpus": size * 8,
        "without_s": round(without, 3),
        "with_slurm_jobs_s": round(with_jobs, 3),
        "ratio": round(with_jobs / without, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(size) for size in (QUICK if args.quick else SIZES)]
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
    else:
        for r in rows:
            print(
                f"{r['gpus']:>6} GPUs  without jobs {r['without_s']:>7.3f} s  "
                f"with Slurm's jobs {r['with_slurm_jobs_s']:>7.3f} s  ratio {r['ratio']:.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
