#!/usr/bin/env python3
"""Benchmark of the pairing strategies: rounds, tests and node time to find the bad nodes.

Simulated (a group fails when it holds a bad node; optional noise, with the
engine's repeat-once rule). Compares ``regroup`` (guardctl's default) with
testing every suspect against a known-good node (``one_vs_good``) and with a
two-round pairing scheme (``two_round``). A round costs one sweep duration, so
rounds are the wall-clock cost; tests and node slots are the cluster's cost.

Usage: python bench/pairing.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from guardctl.sweep import pairing

SCENARIOS = [  # suspects, bad, known-good nodes
    (16, 1, 2),
    (64, 2, 2),
    (64, 8, 4),
    (256, 4, 4),
    (256, 26, 8),
    (1024, 10, 8),
]
QUICK = SCENARIOS[:3]


def run(scenarios: list[tuple[int, int, int]], seeds: int, noise: float) -> list[dict[str, object]]:
    rows = []
    for suspects, bad, goods in scenarios:
        for strategy in ("regroup", "two_round", "one_vs_good"):
            rounds, tests, slots, exact = [], [], [], 0
            started = time.perf_counter()
            for seed in range(seeds):
                outcome, truth = pairing.simulate(
                    strategy, suspects, bad, goods, seed=seed, noise=noise
                )
                rounds.append(outcome.rounds)
                tests.append(outcome.tests)
                slots.append(outcome.node_slots)
                exact += outcome.bad == truth
            rows.append(
                {
                    "suspects": suspects,
                    "bad": bad,
                    "goods": goods,
                    "strategy": strategy,
                    "rounds": statistics.mean(rounds),
                    "tests": statistics.mean(tests),
                    "node_slots": statistics.mean(slots),
                    "exact": exact / seeds,
                    "cpu_ms": (time.perf_counter() - started) * 1000 / seeds,
                }
            )
    # Ratios against the baseline strategy measured in the same run.
    base = {
        (r["suspects"], r["bad"], r["goods"]): r for r in rows if r["strategy"] == "one_vs_good"
    }
    for r in rows:
        b = base[(r["suspects"], r["bad"], r["goods"])]
        r["rounds_vs_one_vs_good"] = round(float(r["rounds"]) / float(b["rounds"]), 3)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few scenarios and seeds (CI)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--noise",
        type=float,
        default=0.02,
        help="chance that a healthy group's test fails (before the repeat)",
    )
    args = parser.parse_args()
    rows = run(QUICK if args.quick else SCENARIOS, 5 if args.quick else 20, args.noise)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"{'suspects':>8} {'bad':>4} {'goods':>5}  {'strategy':<12}{'rounds':>7}"
        f"{'x base':>8}{'tests':>8}{'slots':>8}{'exact':>7}"
    )
    for r in rows:
        print(
            f"{r['suspects']:>8} {r['bad']:>4} {r['goods']:>5}  {r['strategy']:<12}"
            f"{r['rounds']:>7.1f}{r['rounds_vs_one_vs_good']:>8.3f}{r['tests']:>8.1f}"
            f"{r['node_slots']:>8.1f}{r['exact']:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
