"""What a slow node costs its job: how much faster the job would run without it.

In synchronous training every rank waits for the slowest at each step, so a step lasts the
slowest rank's busy time plus the communication that follows. Were the slow node's ranks at
their peers' pace, the step would shrink by the gap between its busiest rank and the busiest
rank elsewhere in the job. That gap over the step time is the job's slowdown; times the job's
GPUs and 24 h it is what the node costs a day in GPU-hours ("node17 costs job 40117 14%,
860 GPU-h/day"). The controller's ski-rental requeue rule (:mod:`guardctl.controller.requeue`)
reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Impact:
    """The cost of one node to its job, from the newest window's step records."""

    job: str
    fraction: float  # of the step time the job would save without the node's slowness
    gpus: int  # ranks of the job (one per GPU)
    step_s: float  # the job's step time now
    step_s_without: float  # the step time were the node at its peers' pace

    @property
    def gpu_hours_per_day(self) -> float:
        return self.fraction * self.gpus * 24.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "pct": round(100 * self.fraction, 1),
            "gpu_h_per_day": round(self.gpu_hours_per_day, 1),
            "gpus": self.gpus,
            "step_s": round(self.step_s, 4),
            "step_s_without": round(self.step_s_without, 4),
        }


def job_impact(
    job: str, node_busy_s: Sequence[float], others_busy_s: Sequence[float], step_s: float, gpus: int
) -> Impact | None:
    """The node's impact from its ranks' and the other ranks' busy times (seconds per step)."""
    if not node_busy_s or not others_busy_s or step_s <= 0:
        return None
    saved = max(0.0, max(node_busy_s) - max(others_busy_s))
    saved = min(saved, step_s)
    return Impact(job, saved / step_s, gpus, step_s, step_s - saved)


def describe(node: str, impact: dict[str, Any] | None) -> str:
    """The operator's line: ``node17 costs job 40117 14%, 860 GPU-h/day``."""
    if not impact:
        return ""
    return (
        f"{node} costs job {impact['job']} {impact['pct']:g}%, "
        f"{impact['gpu_h_per_day']:.0f} GPU-h/day"
    )
