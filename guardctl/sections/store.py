"""[store]: where the shared store (telemetry, action log, results) lives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from guardctl.storage.segments import DEFAULT_MINUTES, check_minutes


@dataclass(frozen=True)
class StoreSettings:
    """The shared-filesystem directory every node and command agrees on."""

    # The default is a local directory: writers refuse it, as any root, without the marker that
    # `guardctl store init` writes (so a store that is not mounted is never written).
    root: Path = Path("/var/lib/guardctl")  # set it to the shared store (guardctl store init)
    # What `guardctl store prune` keeps when --older-than is not given.
    retention_days: float = 14.0  # days of every file: JSON Lines, closed segments (Parquet)
    # Once a segment is closed its Parquet holds every record, and its JSON Lines (two entries
    # a node each segment) only weigh on every listing of the store. Longer than
    # retention_days means retention_days: retention deletes every older file anyway, and
    # refusing it would make the default an error wherever less than a day is kept.
    raw_retention_hours: float = 24.0  # hours of JSON Lines a closed segment holds whole
    # Shorter segments let the closed ones be compacted sooner; readers need no setting, as each
    # file's name says the span it covers.
    segment_minutes: int = DEFAULT_MINUTES  # minutes per telemetry file; must divide 60

    def __post_init__(self) -> None:
        if self.retention_days <= 0:
            raise ValueError("retention_days: must be positive")
        if self.raw_retention_hours <= 0:
            raise ValueError("raw_retention_hours: must be positive")
        check_minutes(self.segment_minutes)
