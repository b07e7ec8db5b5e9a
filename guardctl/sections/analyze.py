"""[analyze]: the detection window, persistence, peer rules, closed segments, thresholds."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# XIDs that point at the hardware (not at the job): 48 DBE, 61/62 internal micro-controller,
# 63/64 row remapping, 74 NVLink, 79 fell off the bus, 92 high SBE rate, 94/95 contained /
# uncontained ECC, 119/120 GSP errors.
DEFAULT_HARDWARE_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)


@dataclass(frozen=True)
class AnalyzeSettings:
    """Window and persistence; per-detector thresholds live in ``detectors``."""

    window_s: float = 300.0
    persist_k: int = 2  # a node is suspect when flagged in k ...
    persist_n: int = 3  # ... of the last n windows
    min_samples: int = 3  # fewer samples in the window: verdict "unknown"
    min_coverage: float = 0.5  # share of the window the agent's samples must cover
    min_peers: int = 8  # GPUs / ports needed to compare within a job
    # Ranks needed to compare within a job, or within one pipeline stage of it: a rank is
    # compared with the ranks doing the same work, and a stage may have only a few replicas.
    min_rank_peers: int = 3
    # A pipeline stage whose fastest rank computes this much longer than the other stages'
    # ranks (in persist_k windows) is reported as the job's imbalance; 0: not looked for.
    stage_imbalance: float = 0.15
    # A rank too few peers can judge is compared with its own earlier windows of the same
    # job: this many windows before the last persist_n are read for it (0: not judged).
    own_history: int = 3  # windows of a rank's own history (small jobs)
    # A job whose step time is this much above its own (the median of its own_history
    # windows) in job_slowdown_windows of the last persist_n windows, with no node of it
    # flagged, is reported as slowed: a job-level finding, never a node's (0: not looked for).
    job_slowdown: float = 0.25
    job_slowdown_windows: int = 0  # 0: persist_k
    low_quantile: float = 0.3  # a fault must hold in this share of a window to show
    hardware_xids: tuple[int, ...] = DEFAULT_HARDWARE_XIDS
    cache: bool = True  # read closed segments from <store>/segments (false: every file)
    workers: int = 0  # processes parsing JSON Lines (0: one per CPU)
    # (Decoding column files, figuring window tables, running the detectors.)
    threads: int = 0  # threads a pass computes with (0: one per processor it may run on)
    # Read the writers' column mirrors (<hour>.cols) instead of parsing where present.
    column_files: bool = True
    evidence_per_node: int = 20  # most evidence entries reported per node
    # [analyze.detectors.<name>] key = number: thresholds per detector plugin
    detectors: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError("window_s: must be positive")
        if not 1 <= self.persist_k <= self.persist_n:
            raise ValueError("persist_k: must be between 1 and persist_n")
        if self.min_samples < 1:
            raise ValueError("min_samples: must be >= 1")
        if not 0 <= self.min_coverage <= 1:
            raise ValueError("min_coverage: must be between 0 and 1")
        if self.min_peers < 2:
            raise ValueError("min_peers: must be >= 2")
        if self.stage_imbalance < 0:
            raise ValueError("stage_imbalance: must be >= 0 (0: not looked for)")
        if self.own_history < 0:
            raise ValueError("own_history: must be >= 0 (0: small jobs not judged)")
        if self.job_slowdown < 0:
            raise ValueError("job_slowdown: must be >= 0 (0: not looked for)")
        if not 0 <= self.job_slowdown_windows <= self.persist_n:
            raise ValueError("job_slowdown_windows: must be between 0 (persist_k) and persist_n")
        if self.min_rank_peers < 3:
            raise ValueError("min_rank_peers: must be >= 3 (two ranks cannot say which is slow)")
        if not 0 < self.low_quantile <= 0.5:
            raise ValueError("low_quantile: must be in (0, 0.5]")
        if self.workers < 0:
            raise ValueError("workers: must be >= 0")
        if self.threads < 0:
            raise ValueError("threads: must be >= 0 (0: one per processor)")
        if self.evidence_per_node < 1:
            raise ValueError("evidence_per_node: must be >= 1")

    def parsers(self) -> int:
        """Processes parsing JSON Lines: ``workers``, or (0) one per processor."""
        return self.workers or processors()

    def pass_threads(self) -> int:
        """Threads a pass computes with: ``threads``, or (0) one per processor."""
        return self.threads or processors()


def processors() -> int:
    """The processors this process may run on (its affinity: a controller pinned to two cores
    gets two; where the system cannot say, every processor)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1
