#!/usr/bin/env python3
"""Detection benchmark: precision, recall and time to detect over many seeds and fleet sizes.

For each (fleet size, seed) it simulates a 30-minute trace with every fault
kind injected (``--faults all:K``) and every benign confounder, plus one
fault-free fleet per size, then runs the analyzer every 60 s over the trace as
a timer would (``guardctl.simulate.score``). A fault counts as detected at the
first pass that calls its node suspect after its onset; every other suspect,
in any pass, is a false positive. Time to detect is in windows (5 min).

Targets: precision and recall >= 0.98, zero false positives on clean fleets,
detection within two windows of onset.

    python bench/detect_quality.py            # 3 sizes x 8 seeds
    python bench/detect_quality.py --quick    # 2 sizes x 3 seeds (CI)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from guardctl.analyze import load
from guardctl.config import Settings
from guardctl.simulate import simulate
from guardctl.simulate.score import score_trace


def run(sizes: list[int], seeds: list[int], per_kind: int, workdir: Path) -> dict[str, object]:
    settings = Settings()
    rows = []
    by_kind: dict[str, list[float]] = defaultdict(list)
    missed_kinds: dict[str, int] = defaultdict(int)
    ttd_kind: dict[str, list[float]] = defaultdict(list)
    for nodes in sizes:
        agg = {
            "nodes": nodes,
            "traces": 0,
            "faults": 0,
            "detected": 0,
            "false_nodes": 0,
            "false_passes": 0,
            "passes": 0,
            "ttd": [],
            "clean_false": 0,
        }
        for seed in seeds:
            out = workdir / f"n{nodes}-s{seed}"
            per = per_kind if nodes >= 64 else 1
            truth = simulate(out, nodes=nodes, duration=1800, seed=seed, faults=f"all:{per}")
            score = score_trace(load(out, settings), truth, settings.analyze, step_s=60)
            agg["traces"] += 1
            agg["faults"] += score.faults
            agg["detected"] += score.detected
            agg["false_nodes"] += len(score.false_nodes)
            agg["false_passes"] += score.false_passes
            agg["passes"] += score.passes
            agg["ttd"] += score.ttd_windows
            kinds = {i.node: i.kind for i in truth.faults}
            for node, windows in score.ttd.items():
                by_kind[kinds[node]].append(1.0)
                ttd_kind[kinds[node]].append(windows)
            for m in score.missed:
                missed_kinds[m.split(":")[1]] += 1
                by_kind[m.split(":")[1]].append(0.0)
        clean_out = workdir / f"n{nodes}-clean"
        truth = simulate(clean_out, nodes=nodes, duration=1800, seed=10_000 + nodes, faults="none")
        clean = score_trace(load(clean_out, settings), truth, settings.analyze, step_s=60)
        agg["clean_false"] = len(clean.false_nodes)
        agg["clean_passes"] = clean.passes
        rows.append(agg)
        print(
            f"{nodes} nodes: {json.dumps({k: v for k, v in agg.items() if k != 'ttd'})}",
            file=sys.stderr,
        )
    return {
        "rows": rows,
        "by_kind": {k: float(np.mean(v)) for k, v in by_kind.items()},
        "ttd_kind": {k: (float(np.median(v)), float(np.max(v))) for k, v in ttd_kind.items()},
        "missed_kinds": dict(missed_kinds),
    }


def table(result: dict[str, object]) -> str:
    lines = [
        "| fleet | traces | faults | precision | recall | false positives (nodes / "
        "node-passes) | clean fleet false positives | time to detect, windows: "
        "median / p95 / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:  # type: ignore[attr-defined]
        called = r["detected"] + r["false_nodes"]
        precision = r["detected"] / called if called else 1.0
        recall = r["detected"] / r["faults"] if r["faults"] else 1.0
        ttd = np.array(r["ttd"]) if r["ttd"] else np.array([np.nan])
        lines.append(
            f"| {r['nodes']} nodes ({r['nodes'] * 8} GPUs) | {r['traces']} | {r['faults']} "
            f"| {precision:.3f} | {recall:.3f} | {r['false_nodes']} / {r['false_passes']} of "
            f"{r['passes']} passes | {r['clean_false']} in {r['clean_passes']} passes "
            f"| {np.median(ttd):.2f} / {np.percentile(ttd, 95):.2f} / {ttd.max():.2f} |"
        )
    lines += ["", "| fault | recall | time to detect, windows: median / max |", "|---|---|---|"]
    by_kind: dict[str, float] = result["by_kind"]  # type: ignore[assignment]
    ttd_kind: dict[str, tuple[float, float]] = result["ttd_kind"]  # type: ignore[assignment]
    for kind in sorted(by_kind):
        med, top = ttd_kind.get(kind, (float("nan"), float("nan")))
        lines.append(f"| {kind} | {by_kind[kind]:.3f} | {med:.2f} / {top:.2f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 sizes x 3 seeds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [32, 96] if args.quick else [32, 96, 256]
    seeds = list(range(1, 4)) if args.quick else list(range(1, 9))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="guardctl-quality-") as tmp:
        result = run(sizes, seeds, per_kind=2, workdir=Path(tmp))
    result["seconds"] = time.perf_counter() - t0
    if args.json:
        out = dict(result)
        for r in out["rows"]:  # type: ignore[attr-defined]
            r["ttd"] = [round(x, 3) for x in r["ttd"]]
        print(json.dumps(out, indent=1))
    else:
        print(table(result))
        print(f"\n({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
