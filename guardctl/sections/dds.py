"""[dds]: the per-job dynamic data-sharding service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DdsSettings:
    """Lease timing, where the service keeps its state, and how clients retry."""

    state_dir: str = ""  # empty: <store>/dds/<job>; else <state_dir>/dds/<job> (a local disk)
    lease_s: float = 30.0  # a lease not renewed or acknowledged within this goes back to the queue
    bind: str = ""  # empty: the node's own address (what its hostname resolves to)
    port: int = 0  # 0: any free port; the chosen one is published in the job's dds dir
    max_connections: int = 16384  # client connections at once (one per rank); more get 503
    commit_interval_ms: float = 0.0  # group commit: extra wait for writes to join a batch (0: none)
    speed_halflife: int = (
        4  # the worker speed estimate forgets half its weight after this many reports
    )
    client_retry_s: float = 120.0  # how long a client keeps retrying an unreachable service
    discover_timeout_s: float = 120.0  # how long a client waits for the service's address to appear
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"  # auto: uvloop where installed

    def __post_init__(self) -> None:
        if self.lease_s <= 0:
            raise ValueError("lease_s: must be positive")
        if not 0 <= self.port <= 65535:
            raise ValueError("port: must be 0..65535")
        if self.max_connections < 1:
            raise ValueError("max_connections: must be positive")
        if self.commit_interval_ms < 0:
            raise ValueError("commit_interval_ms: must not be negative")
        if self.speed_halflife < 1:
            raise ValueError("speed_halflife: must be at least 1")
        if self.client_retry_s <= 0 or self.discover_timeout_s <= 0:
            raise ValueError("client_retry_s, discover_timeout_s: must be positive")
