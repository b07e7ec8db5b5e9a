"""[dds]: the per-job dynamic data-sharding service."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DdsSettings:
    """Lease timing and where the service keeps its state."""

    state_dir: str = ""  # empty: <store>/dds/<job>
    lease_s: float = 30.0
    bind: str = "0.0.0.0"

    def __post_init__(self) -> None:
        if self.lease_s <= 0:
            raise ValueError("lease_s: must be positive")
