"""[safety]: the caps and switches that keep guardctl from harming a fleet."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SafetySettings:
    """Limits on how many nodes guardctl may hold out of service at once."""

    max_out_fraction: float = 0.10  # of the nodes Slurm knows
    max_out_nodes: int = 16  # absolute, whatever the cluster size
    observe_only: bool = False  # every acting command behaves as --dry-run
    max_actions_per_hour: int = 60
    # In-service nodes guardctl may hold at once as known-good partners of multi-node sweep
    # jobs (each for the length of one job), over all sweeps; suspects count in the cap above.
    max_sweep_partners: int = 4
    reason_prefix: str = "guardctl:"

    def __post_init__(self) -> None:
        if not 0.0 < self.max_out_fraction <= 1.0:
            raise ValueError("max_out_fraction: must be in (0, 1]")
        if self.max_out_nodes < 0:
            raise ValueError("max_out_nodes: must be >= 0")
        if self.max_sweep_partners < 0:
            raise ValueError("max_sweep_partners: must be >= 0")
        if self.max_actions_per_hour < 1:
            raise ValueError("max_actions_per_hour: must be >= 1")
        if not self.reason_prefix.strip():
            raise ValueError("reason_prefix: must not be empty")
