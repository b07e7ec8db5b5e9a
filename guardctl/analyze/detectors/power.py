"""power: a busy GPU drawing much less power than its peers under the same load (power brake).

Peers are the GPUs of the same job in the same window, so load is comparable;
a GPU held at its software power cap draws *at* its limit and is not flagged.
"""

from __future__ import annotations

from guardctl.analyze.detectors import Flags, below_peers_under_load, register
from guardctl.analyze.features import Features


@register
class Power:
    name = "power"
    defaults = {"rel": 0.15, "z": 5.0, "busy_util_pct": 50.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        return below_peers_under_load(
            self.name,
            f,
            th,
            "power_lo",
            "power_w",
            "W",
            "power draw below peers under the same load",
        )
