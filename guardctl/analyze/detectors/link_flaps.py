"""link_flaps: a network port that went down (``link_downed`` rose, or state not ACTIVE).

One flap flags one window; the persistence rule makes repeated flaps a finding.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, register
from guardctl.analyze.features import Features


@register
class LinkFlaps:
    name = "link_flaps"
    defaults = {"downs_per_window": 1.0, "down_frac": 0.05}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.nic
        if not len(t):
            return []
        downs = t["link_downed"]
        hit = (downs >= th["downs_per_window"]) | (t["down_frac"] >= th["down_frac"])
        n = int(hit.sum())
        sev = np.maximum(downs[hit] / th["downs_per_window"], t["down_frac"][hit] / th["down_frac"])
        return [
            Flags(
                self.name,
                "link_downed",
                "downs/window",
                "link went down",
                t["w"][hit],
                t["node"][hit],
                downs[hit],
                np.zeros(n),
                np.full(n, np.nan),
                sev,
                port=t["port"][hit],
            )
        ]
