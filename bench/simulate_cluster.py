#!/usr/bin/env python3
"""Benchmark of the cluster simulation (``guardctl simulate cluster``): its speed and scaling.

For each fleet size, a week of guardctl's controller on the default fault mix, against the
baseline measured in the same run: the same cluster calm (no faults, no confounders, no
mitigation), which is the event engine, the jobs and the in-memory Slurm alone. The ratio says
what the faults and the controller cost on top; the per-node-day cost at the largest size over
the smallest says whether the run grows linearly with the fleet. Beside it, the fabric-aware
controller (``guardctl-fabric``: fabric localisation every pass) with the fabric faults added:
what localisation costs the run. Last, the wall time of the whole comparison at 16k GPUs x 7
days (the fault-free run and the four policies, one seed).

Usage: python bench/simulate_cluster.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from guardctl.simulate.cluster.params import Params
from guardctl.simulate.cluster.policies import FABRIC
from guardctl.simulate.cluster.run import compare, simulate

SIZES = [250, 1000, 2000]
QUICK = [125, 250]


def timed(p: Params, policy: str) -> float:
    started = time.perf_counter()
    simulate(p, policy)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    days = 2.0 if args.quick else 7.0
    rows = []
    for size in QUICK if args.quick else SIZES:
        p = Params(nodes=size, days=days)
        calm = timed(p.calm(), "none")
        full = timed(p, "guardctl")
        fabric = timed(dataclasses.replace(p, fabric=True), FABRIC)
        rows.append(
            {
                "nodes": size,
                "gpus": size * p.gpus_per_node,
                "days": days,
                "calm_s": round(calm, 2),
                "guardctl_s": round(full, 2),
                "ratio": round(full / calm, 2),
                "fabric_s": round(fabric, 2),
                "fabric_ratio": round(fabric / full, 2),
                "us_per_node_day": round(full / (size * days) * 1e6, 1),
            }
        )
    scaling = rows[-1]["us_per_node_day"] / rows[0]["us_per_node_day"]
    whole = Params(nodes=rows[-1]["nodes"], days=days)
    started = time.perf_counter()
    compare(whole, [0])
    out = {
        "rows": rows,
        "per_node_day_ratio": round(scaling, 2),
        "compare_all_s": round(time.perf_counter() - started, 1),
        "compare_of": f"{whole.nodes * whole.gpus_per_node} GPUs x {days:g} days",
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for r in rows:
        print(
            f"{r['gpus']:>6} GPUs x {r['days']:g} d  calm {r['calm_s']:>6.2f} s  "
            f"guardctl {r['guardctl_s']:>6.2f} s  ratio {r['ratio']:>5.2f}  "
            f"{r['us_per_node_day']:>7.1f} us/node-day  "
            f"guardctl-fabric with fabric faults {r['fabric_s']:>6.2f} s ({r['fabric_ratio']:.2f}x)"
        )
    print(f"per-node-day cost, largest / smallest fleet: {scaling:.2f}")
    print(f"all policies and the fault-free run, {out['compare_of']}: {out['compare_all_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
