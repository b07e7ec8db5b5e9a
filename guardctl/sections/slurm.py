"""[slurm]: how guardctl talks to Slurm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SlurmSettings:
    """Backend choice, binaries and timeouts for Slurm commands."""

    # pyslurm 25.11 needs Slurm 25.11, which was not in reach: that backend is untested.
    backend: Literal["cli", "pyslurm"] = "cli"  # pyslurm: experimental (no controller test)
    bin_dir: str = ""  # empty: look Slurm's commands up in /usr/bin, /usr/local/bin, PATH
    conf: str = ""  # a slurm.conf to use (exported as SLURM_CONF; missing: exit 3); empty: default
    timeout_s: float = 30.0  # a Slurm command taking longer means the controller is not answering
    poll_interval_s: float = 0.5
    settle_timeout_s: float = 30.0  # how long to wait for a node to show a new state

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")
        if self.poll_interval_s <= 0:
            raise ValueError("poll_interval_s: must be positive")
