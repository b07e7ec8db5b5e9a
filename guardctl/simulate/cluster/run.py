"""Runs: one policy on one seed, and the comparison of policies over seeds.

Each seed runs once fault-free (same jobs, same confounders, no node faults) to measure the
work a cluster would do; each policy's run on that seed is judged against it.

With fabric faults (:func:`compare_fabric`) each policy also runs the seed without them (the
same node faults): the difference in work done is what the fabric faults cost it.
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
from guardctl.simulate.cluster.faults import Onset
from guardctl.simulate.cluster.metrics import Tally
from guardctl.simulate.cluster.params import Params

Progress = Callable[[str], None]
# Today's node-only controller and the same controller told the tree, on the same faults.
FABRIC_POLICIES = ("guardctl", policies.FABRIC)


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
    p: Params,
    policy: str,
    cfg: ControlSettings | None = None,
    progress: Progress | None = None,
    extra: Sequence[Onset] = (),
) -> Tally:
    """One run of *policy* on the cluster *p* (*extra*: faults beside the drawn ones)."""
    return Cluster(
        p, policies.make(policy, cfg or control_settings(p), safety_settings(p)), progress, extra
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


def compare_fabric(
    p: Params,
    seeds: Sequence[int],
    names: Sequence[str] = FABRIC_POLICIES,
    cfg: ControlSettings | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every policy on every seed with the fabric faults beside the node faults, and again
    without them: per policy the figures of the first, and the GPU-hours the fabric faults
    cost it (``gpu_h_lost_to_fabric``: the work the second did that the first did not)."""
    fab = dataclasses.replace(p, fabric=True)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for seed in seeds:
        ps = dataclasses.replace(fab, seed=seed)
        base = simulate(ps.fault_free(), "none", cfg)
        for name in names:
            if progress:
                progress(f"seed {seed}: {name}, fabric and node faults")
            tally = simulate(ps, name, cfg, progress)
            if progress:
                progress(f"seed {seed}: {name}, the node faults alone")
            alone = simulate(dataclasses.replace(ps, fabric=False), name, cfg, progress)
            runs[name].append(
                {
                    "seed": seed,
                    **tally.figures(base.useful_gpu_h),
                    "gpu_h_lost_to_fabric": round(alone.useful_gpu_h - tally.useful_gpu_h, 1),
                }
            )
    return {
        "params": dataclasses.asdict(fab),
        "seeds": list(seeds),
        "fabric": True,
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
