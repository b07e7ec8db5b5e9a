#!/usr/bin/env python3
"""Benchmark of the pairing strategies: rounds, tests and node time to find the bad nodes.

Simulated (a group fails when it holds a bad node; optional noise, with the
engine's repeat-once rule). Compares ``regroup`` (guardctl's default) with
testing every suspect against a known-good node (``one_vs_good``) and with a
two-round pairing scheme (``two_round``). A round costs one sweep duration, so
rounds are the wall-clock cost; tests and node slots are the cluster's cost.

With ``--fabric``: localising a fault of the network instead (a bad cable, a slow leaf switch,
a slow leaf uplink, a slow spine group, in a tree of leaves under spine groups): a test is slow
when its traffic goes through the faulty component. Partners chosen by the tree (guardctl's
pairing when Slurm or ``[control] racks`` gives one) against ``regroup`` blind to the tree,
run in the same run: rounds, tests, whether the verdict is exact (the component named, or the
node with the bad cable found bad) and how many healthy nodes would be drained.

Usage: python bench/pairing.py [--quick] [--json] [--fabric]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from guardctl.sweep import engine, fabric, pairing
from guardctl.topology import Switch, Topology

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


FABRIC_SCENARIOS = [  # leaves, nodes per leaf, leaves per spine group, suspects flagged
    (4, 4, 2, 2),
    (8, 8, 2, 4),
    (16, 16, 4, 6),
]
KINDS = ("link", "leaf", "uplink", "spine")
PARTNERS = 4  # safety.max_sweep_partners' default


def tree(leaves: int, per_leaf: int, per_spine: int) -> Topology:
    switches: dict[str, Switch] = {}
    for i in range(leaves):
        nodes = tuple(f"n{i * per_leaf + j:04d}" for j in range(per_leaf))
        switches[f"leaf{i:02d}"] = Switch(f"leaf{i:02d}", nodes)
    spines = []
    for k in range(0, leaves, per_spine):
        name = f"spine{k // per_spine:02d}"
        under = tuple(f"leaf{j:02d}" for j in range(k, min(leaves, k + per_spine)))
        switches[name] = Switch(name, (), under)
        spines.append(name)
    switches["core"] = Switch("core", (), tuple(spines))
    return Topology(switches)


def fault_and_suspects(
    t: Topology, kind: str, flagged: int, rng: random.Random
) -> tuple[str, list[str], set[str]]:
    """A fault of *kind*, the suspects the analysis would flag, the nodes truly bad."""
    node = rng.choice(t.nodes())
    leaf = t.leaf_of(node) or ""
    if kind == "link":
        others = [n for n in t.nodes() if n != node]
        return f"link:{node}", sorted({node, *rng.sample(others, flagged - 1)}), {node}
    if kind == "spine":
        spine = t.parent_of(leaf) or ""
        return f"spine:{spine}", sorted(rng.sample(t.nodes_under(spine), flagged)), set()
    under = t.nodes_under(leaf)
    return f"{kind}:{leaf}", sorted(rng.sample(under, min(flagged, len(under) - 1))), set()


def run_fabric(seeds: int) -> list[dict[str, object]]:
    rows = []
    for leaves, per_leaf, per_spine, flagged in FABRIC_SCENARIOS:
        t = tree(leaves, per_leaf, per_spine)
        for kind in KINDS:
            for aware in (True, False):
                rounds, tests, exact, drained = [], [], 0, []
                for seed in range(seeds):
                    rng = random.Random(seed)
                    fault, suspects, truth = fault_and_suspects(t, kind, flagged, rng)

                    def oracle(groups: list[pairing.Group]) -> list[bool | None]:
                        return [fault not in fabric.carried(g, t) for g in groups]  # noqa: B023

                    idle = [n for n in t.nodes() if n not in suspects]
                    # As many partners as the engine borrows by default (the partner cap).
                    goods = (engine.by_leaf(idle, suspects, t) if aware else idle)[:PARTNERS]
                    outcome = pairing.find_bad(
                        "regroup", suspects, goods, oracle, topology=t if aware else None
                    )
                    rounds.append(outcome.rounds)
                    tests.append(outcome.tests)
                    named = set(outcome.fabric) == ({fault} if kind != "link" else set())
                    exact += outcome.bad == truth and named
                    drained.append(len(outcome.bad - truth))
                rows.append(
                    {
                        "tree": f"{leaves}x{per_leaf}/{per_spine}",
                        "suspects": flagged,
                        "fault": kind,
                        "pairing": "by topology" if aware else "regroup, blind",
                        "rounds": statistics.mean(rounds),
                        "rounds_max": max(rounds),
                        "tests": statistics.mean(tests),
                        "exact": exact / seeds,
                        "healthy_drained": statistics.mean(drained),
                    }
                )
    return rows


def print_fabric(rows: list[dict[str, object]]) -> None:
    print(
        f"{'tree':>10} {'susp':>4}  {'fault':<7}{'pairing':<16}{'rounds':>7}{'max':>5}"
        f"{'tests':>7}{'exact':>7}{'drained':>9}"
    )
    for r in rows:
        print(
            f"{r['tree']:>10} {r['suspects']:>4}  {r['fault']:<7}{r['pairing']:<16}"
            f"{r['rounds']:>7.1f}{r['rounds_max']:>5}{r['tests']:>7.1f}{r['exact']:>7.2f}"
            f"{r['healthy_drained']:>9.2f}"
        )


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
    parser.add_argument("--fabric", action="store_true", help="localise fabric faults")
    args = parser.parse_args()
    if args.fabric:
        fabric_rows = run_fabric(5 if args.quick else 20)
        if args.json:
            print(json.dumps(fabric_rows, indent=1))
        else:
            print_fabric(fabric_rows)
        return 0
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
