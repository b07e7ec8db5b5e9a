"""[hooks]: what a Slurm hook does when a check fails and guardctl does not drain the node."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HooksSettings:
    """A failing prolog or epilog makes Slurm drain the node itself, outside guardctl's cap and
    ownership. So a hook exits 1 only where guardctl drained the node; where it did not (the cap
    is reached, Slurm or the store cannot be reached, observe-only, or a fleet-wide burst of
    the same failing check) the hook passes and raises an alert (slurmd's log, syslog and a
    'hook failed' note in the action log)."""

    fail_when_not_drained: bool = False  # true: exit 1 anyway; Slurm then drains the node itself
    burst_nodes: int = 3  # this many nodes failing one check within burst_window_s: fleet-wide
    burst_window_s: float = 600.0  # how far back the action log's hook failures count

    def __post_init__(self) -> None:
        if self.burst_nodes < 2:
            raise ValueError("burst_nodes: must be at least 2")
        if not self.burst_window_s > 0:
            raise ValueError("burst_window_s: must be positive")
