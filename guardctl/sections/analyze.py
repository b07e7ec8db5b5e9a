"""[analyze]: the detection window, persistence and detector thresholds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AnalyzeSettings:
    """Window and persistence; per-detector thresholds live in ``detectors``."""

    window_s: float = 300.0
    persist_k: int = 2  # a node is suspect when flagged in k ...
    persist_n: int = 3  # ... of the last n windows
    min_samples: int = 3  # fewer samples in the window: verdict "unknown"
    # [analyze.detectors.<name>] key = number: thresholds per detector plugin
    detectors: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError("window_s: must be positive")
        if not 1 <= self.persist_k <= self.persist_n:
            raise ValueError("persist_k: must be between 1 and persist_n")
        if self.min_samples < 1:
            raise ValueError("min_samples: must be >= 1")
