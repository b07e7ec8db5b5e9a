"""[agent]: the per-node telemetry agent."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AgentSettings:
    """Sampling interval, collectors and their roots."""

    interval_s: float = 5.0
    collectors: tuple[str, ...] = ("nvml", "host", "infiniband")
    collector_timeout_s: float = 2.0
    sysfs_root: str = "/sys"
    buffer_records: int = 100_000  # kept in memory while the store cannot be written

    def __post_init__(self) -> None:
        if not 1.0 <= self.interval_s <= 10.0:
            raise ValueError("interval_s: must be between 1 and 10 seconds")
        if self.collector_timeout_s <= 0:
            raise ValueError("collector_timeout_s: must be positive")
        if self.buffer_records < 1:
            raise ValueError("buffer_records: must be >= 1")
