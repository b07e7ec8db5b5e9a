"""[sweep]: burn-in and all-reduce sweeps and their pass criteria."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SweepSettings:
    """Durations, tolerances and where the sweep job scripts live."""

    gemm_duration_s: float = 300.0
    tolerance: float = 0.92  # pass at >= tolerance x baseline
    repeat_failures: int = 1  # a failure is repeated this many times before it counts
    scripts_dir: str = ""  # empty: the sweeps/ folder shipped with guardctl
    job_timeout_s: float = 3600.0
    partition: str = ""

    def __post_init__(self) -> None:
        if self.gemm_duration_s <= 0:
            raise ValueError("gemm_duration_s: must be positive")
        if not 0.0 < self.tolerance <= 1.0:
            raise ValueError("tolerance: must be in (0, 1]")
        if self.repeat_failures < 0:
            raise ValueError("repeat_failures: must be >= 0")
