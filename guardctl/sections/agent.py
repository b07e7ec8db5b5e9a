"""[agent]: the per-node telemetry agent."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AgentSettings:
    """Sampling interval, collectors and their roots."""

    interval_s: float = 5.0
    collectors: tuple[str, ...] = ("nvml", "host", "infiniband")
    collector_timeout_s: float = 2.0
    # Per-collector overrides of collector_timeout_s, e.g. {nvml = 4.0}.
    timeouts: dict[str, float] = field(default_factory=dict)
    sysfs_root: str = "/sys"
    buffer_records: int = 100_000  # kept in memory while the store cannot be written
    # Keep a binary column mirror (<hour>.cols) beside each telemetry file, which the
    # analyzer reads instead of parsing the JSON Lines (see guardctl-schema(5)).
    column_files: bool = True
    node: str = ""  # empty: the short hostname
    # Local (not shared) file with each collector's health and the store's state;
    # empty disables it.
    status_file: str = "/run/guardctl/agent-status.json"
    # Rewrite it every this many samples, and at once when a state changes.
    status_every: int = 10
    # How often a collector that reported itself unavailable (no driver) is retried.
    retry_unavailable_s: float = 300.0
    # The node's records (its own and the ranks' step records) are appended to the store at
    # most this often: one append and one fsync each time; a crash loses at most this much.
    write_interval_s: float = 10.0
    # Unix socket (node-local) where this node's training ranks hand over their step records,
    # so that only the agent writes the shared store; "{node}" becomes the node's name; empty:
    # none (ranks write the store directly).
    handoff_socket: str = "/run/guardctl/agent.sock"

    def __post_init__(self) -> None:
        if not 1.0 <= self.interval_s <= 10.0:
            raise ValueError("interval_s: must be between 1 and 10 seconds")
        if self.collector_timeout_s <= 0:
            raise ValueError("collector_timeout_s: must be positive")
        for name, seconds in self.timeouts.items():
            if seconds <= 0:
                raise ValueError(f"timeouts.{name}: must be positive")
        if self.buffer_records < 1:
            raise ValueError("buffer_records: must be >= 1")
        if not self.sysfs_root:
            raise ValueError("sysfs_root: must not be empty")
        if self.status_every < 1:
            raise ValueError("status_every: must be >= 1")
        if self.retry_unavailable_s <= 0:
            raise ValueError("retry_unavailable_s: must be positive")
        if not 0 <= self.write_interval_s <= 600:
            raise ValueError("write_interval_s: must be between 0 and 600 seconds")
