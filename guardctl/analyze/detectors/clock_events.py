"""clock_events: NVML clock-event reasons that mean the hardware slowed the GPU, persisting.

0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake count;
0x1 idle, 0x4 SW power cap and 0x10 sync boost are normal and ignored. The
bits must be set in at least ``min_frac`` of the window's samples.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, register
from guardctl.analyze.features import Features


@register
class ClockEvents:
    name = "clock_events"
    defaults = {"min_frac": 0.3}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.gpu
        if not len(t):
            return []
        frac = t["fault_frac"]
        hit = frac >= th["min_frac"]
        ref = np.full(int(hit.sum()), th["min_frac"])
        return [
            Flags(
                self.name,
                "clock_event_reasons",
                "share of samples",
                "hardware slowdown reasons set",
                t["w"][hit],
                t["node"][hit],
                frac[hit],
                ref,
                np.full(ref.size, np.nan),
                frac[hit] / th["min_frac"],
                gpu=t["gpu"][hit],
            )
        ]

    @staticmethod
    def bits(f: Features, w: int, node: int, gpu: int) -> int:
        """The fault bits seen for one GPU in one window (for evidence text)."""
        t = f.gpu
        row = (t["w"] == w) & (t["node"] == node) & (t["gpu"] == gpu)
        return int(np.bitwise_or.reduce(t["fault_bits"][row])) if row.any() else 0
