"""The jobs: a large synchronous job's speed is its slowest member's, piecewise constant.

A job's *factor* is how much longer its step takes than on a healthy, quiet cluster: the
slowest node's factor (a synchronous step waits for the slowest rank), times a whole-job stall
(checkpoint, data loader) and its pipeline-stage imbalance. Between two events the factor is
constant, so progress is integrated exactly without ticking steps. Progress is counted in
seconds of work at full speed; a checkpoint keeps it, a failure loses what came after the
last checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SimJob:
    """One job as the simulation follows it (Slurm knows it by the same id)."""

    job_id: int
    large: bool
    gpus: int
    work_s: float  # seconds of work at full speed; inf: runs past the horizon
    imbalance: float = 1.0  # its slowest pipeline stage's excess (moves with the job)
    stage_nodes: frozenset[str] = frozenset()  # the nodes of its slowest stage, this run
    nodes: tuple[str, ...] = ()
    running: bool = False
    run_start: float = 0.0
    ready: float = 0.0  # progress starts after the restart (start-up, checkpoint load)
    last: float = 0.0
    done_s: float = 0.0
    ckpt_s: float = 0.0
    factor: float = 1.0
    node_factor: float = 1.0  # the part of the factor its nodes' faults cause
    stalls: int = 0
    version: int = 0  # bumped on every change: stale finish events are ignored
    rebalanced: set[str] = field(default_factory=set)  # nodes given less work (data sharding)
    lost_s: float = 0.0  # work lost to failures and requeues, in seconds at full speed
    restarts: int = 0
    variation_s: float = 0.0  # integral of (factor - 1) over running time (large jobs)
    measured_s: float = 0.0

    def advance(self, now: float) -> None:
        """Integrate progress (and the step-time variation) up to *now*."""
        if self.running:
            start = max(self.last, self.ready)
            if now > start:
                dt = now - start
                if math.isfinite(self.factor):
                    self.done_s += dt / self.factor
                    self.variation_s += dt * (self.node_factor - 1.0)
                    self.measured_s += dt
        self.last = now

    def eta(self) -> float:
        """When it finishes at its present speed (inf: never, or hung)."""
        if not self.running or not math.isfinite(self.work_s) or not math.isfinite(self.factor):
            return math.inf
        return max(self.last, self.ready) + (self.work_s - self.done_s) * self.factor

    def checkpoint(self) -> None:
        """A checkpoint keeps the progress so far (a hung job writes none)."""
        if math.isfinite(self.factor):
            self.ckpt_s = self.done_s

    def lose(self) -> None:
        """The run ended early: what came after the last checkpoint is lost."""
        self.lost_s += self.done_s - self.ckpt_s
        self.done_s = self.ckpt_s
        self.running = False
        self.rebalanced.clear()
        self.version += 1


def node_factor(node_factors: list[float], rebalanced: list[float]) -> float:
    """How much its nodes slow a synchronous job: the slowest node's factor.

    *rebalanced* are the factors of the nodes the data-sharding service gives less work: each
    node's share is cut in proportion to its speed (AntDT), so the job runs as if its work were
    spread over the nodes' summed speed instead of waiting for the slowest.
    """
    plain = max(node_factors, default=1.0)
    if rebalanced and math.isfinite(plain):
        speed = sum(1.0 / f for f in rebalanced) + len(node_factors) / plain
        plain = (len(node_factors) + len(rebalanced)) / speed
    return plain
