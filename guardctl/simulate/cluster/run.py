"""Runs: one policy on one seed, and the comparison of policies over seeds.

Each seed runs once fault-free (same jobs, same confounders, no node faults) to measure the
work a cluster would do; each policy's run on that seed is judged against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from guardctl.sections.control import ControlSettings
from guardctl.sections.safety import SafetySettings
from guardctl.simulate.cluster import policies
from guardctl.simulate.cluster.engine import Cluster
from guardctl.simulate.cluster.metrics import Tally
from guardctl.simulate.cluster.params import Params

Progress = Callable[[str], None]


def control_settings(p: Params, **overrides: Any) -> ControlSettings:
    """The controller's settings for a simulated cluster: requeue on, its cost model the jobs'."""
    base = ControlSettings(
        requeue=True,
        checkpoint_interval_s=p.checkpoint_s,
        restart_s=p.restart_s,
        sweep_duration_s=p.sweep_s,
    )
    return dataclasses.replace(base, **overrides)


def safety_settings(p: Params) -> SafetySettings:
    """guardctl's [safety] in the simulated cluster: its caps and rate limit."""
    limit = p.nodes if p.max_out_nodes is None else p.max_out_nodes
    return SafetySettings(
        max_out_fraction=p.max_out_fraction,
        max_out_nodes=limit,
        max_actions_per_hour=p.max_actions_per_hour,
    )


def simulate(
    p: Params, policy: str, cfg: ControlSettings | None = None, progress: Progress | None = None
) -> Tally:
    """One run of *policy* on the cluster *p*."""
    return Cluster(
        p, policies.make(policy, cfg or control_settings(p), safety_settings(p)), progress
    ).run()


def compare(
    p: Params,
    seeds: Sequence[int],
    names: Sequence[str] = policies.NAMES,
    cfg: ControlSettings | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every policy on every seed; per policy the per-seed figures and their means."""
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for seed in seeds:
        ps = dataclasses.replace(p, seed=seed)
        base = simulate(ps.fault_free(), "none", cfg)
        for name in names:
            if progress:
                progress(f"seed {seed}: {name}")
            tally = simulate(ps, name, cfg, progress)
            runs[name].append(
                {
                    "seed": seed,
                    **tally.figures(base.useful_gpu_h),
                    "fault_free_variation": round(base.variation, 4),
                }
            )
    return {
        "params": dataclasses.asdict(p),
        "seeds": list(seeds),
        "policies": {n: {"mean": mean(rows), "runs": rows} for n, rows in runs.items()},
    }


def mean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of each figure over the seeds (None where no seed had one)."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        if key == "seed":
            continue
        vals = [r[key] for r in rows if r[key] is not None]
        out[key] = round(float(np.mean(vals)), 4) if vals else None
    return out
