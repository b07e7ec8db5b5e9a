"""What a run measured, and the figures a policy is judged by.

Per run: useful work (GPU-hours of progress at full speed that no failure took back), work
lost to failures and requeues, the large jobs' step-time variation (the time-weighted mean of
how much longer a step took than on a healthy, quiet cluster), how long a fault cost its job
before it was mitigated, drains, quarantines and sweeps (and the false ones: of nodes without a
fault of their own, a switch's fault's nodes among them), the GPU-hours such healthy nodes
were held out, the nodes out of service, and the fabric components a policy named (right, with
the time from the fault's onset, or wrong). Goodput is a run's useful work over the fault-free
run's of the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from guardctl.simulate.cluster.engine import Cluster


@dataclass
class Tally:
    """Counters a run keeps, and the totals read off its jobs at the end."""

    quarantines: int = 0
    false_quarantines: int = 0  # of nodes without a fault (a switch's fault's nodes among them)
    sweeps: int = 0
    false_sweeps: int = 0
    drains: int = 0  # by guardctl (or the Guard-style baseline): not by NHC or an operator
    false_drains: int = 0
    lemon_drains: int = 0  # drained after a passed sweep, as lemons
    requeues: int = 0
    refused: int = 0  # guardctl's node actions its door refused (cap, rate limit, ownership)
    skipped: int = 0  # guardctl's decisions past control.max_actions_per_hour
    hangs: int = 0
    completed: int = 0
    mitigation_s: list[float] = field(default_factory=list)
    out_of_service: list[int] = field(default_factory=list)
    healthy_held_gpu_h: float = 0.0  # nodes without a fault the policy held out, GPU-hours
    localise_s: list[float] = field(default_factory=list)  # a fabric fault's onset to its name
    named: set[str] = field(default_factory=set)  # components named while at fault
    misnamed: set[str] = field(default_factory=set)  # components named while not at fault
    useful_gpu_h: float = 0.0
    lost_gpu_h: float = 0.0
    variation: float = 0.0
    restarts: int = 0

    def close(self, sim: Cluster) -> None:
        jobs = list(sim.jobs.values())
        self.useful_gpu_h = sum(j.done_s * j.gpus for j in jobs) / 3600.0
        self.lost_gpu_h = sum(j.lost_s * j.gpus for j in jobs) / 3600.0
        large = [j for j in jobs if j.large]
        measured = sum(j.measured_s for j in large)
        self.variation = sum(j.variation_s for j in large) / measured if measured else 0.0
        self.restarts = sum(j.restarts for j in jobs)

    def figures(self, fault_free_gpu_h: float) -> dict[str, Any]:
        """The run's figures against the fault-free run of the same seed."""
        mit = np.array(self.mitigation_s) if self.mitigation_s else None
        loc = np.array(self.localise_s) if self.localise_s else None
        return {
            "goodput": round(self.useful_gpu_h / fault_free_gpu_h, 4) if fault_free_gpu_h else 1.0,
            "gpu_h_lost": round(fault_free_gpu_h - self.useful_gpu_h, 1),
            "gpu_h_lost_to_restarts": round(self.lost_gpu_h, 1),
            "step_time_variation": round(self.variation, 4),
            "mitigation_median_s": None if mit is None else round(float(np.median(mit)), 1),
            "mitigation_p95_s": None if mit is None else round(float(np.percentile(mit, 95)), 1),
            "mitigated": len(self.mitigation_s),
            "drains": self.drains,
            "false_drains": self.false_drains,
            "lemon_drains": self.lemon_drains,
            "quarantines": self.quarantines,
            "false_quarantines": self.false_quarantines,
            "sweeps": self.sweeps,
            "false_sweeps": self.false_sweeps,
            "healthy_held_gpu_h": round(self.healthy_held_gpu_h, 1),
            "localised": len(self.localise_s),
            "localise_median_s": None if loc is None else round(float(np.median(loc)), 1),
            "misnamed": len(self.misnamed),
            "requeues": self.requeues,
            "refused": self.refused,
            "skipped": self.skipped,
            "restarts": self.restarts,
            "nodes_out_of_service": round(float(np.mean(self.out_of_service)), 2)
            if self.out_of_service
            else 0.0,
        }
