"""thermal: a GPU hotter than its peers AND losing clock or showing thermal slowdown bits.

Heat alone is no fault: a rack running warm without throttling stays healthy.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, deviation_test, register
from guardctl.analyze.features import Features
from guardctl.analyze.groups import peer_stats

THERMAL_BITS = 0x20 | 0x40


@register
class Thermal:
    name = "thermal"
    defaults = {"delta_c": 8.0, "z": 4.0, "clock_rel": 0.03, "busy_util_pct": 50.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.gpu
        if not len(t):
            return []
        busy = t["util_med"] >= th["busy_util_pct"]
        value = t["temp_hi"]
        med, mad, _ = peer_stats(t.grouping("peer"), value, busy)
        hot, rdev, sev = deviation_test(
            value, med, mad, direction=1, rel=0.0, z=th["z"], min_abs=th["delta_c"]
        )
        cmed, _, _ = peer_stats(t.grouping("peer"), t["clock_lo"], busy)
        with np.errstate(invalid="ignore", divide="ignore"):
            slower = t["clock_lo"] <= cmed * (1 - th["clock_rel"])
        throttled = (t["fault_bits"] & THERMAL_BITS) != 0
        hit = hot & busy & (slower | throttled)
        return [
            Flags.of(
                self.name,
                "temp_c",
                "C",
                "hotter than peers and throttling",
                t,
                hit,
                value,
                med,
                rdev,
                sev,
                gpu="gpu",
            )
        ]
