"""power: a busy GPU drawing much less power than its peers under the same load (power brake).

Peers are the GPUs of the same job in the same window, so load is comparable;
a GPU held at its software power cap draws *at* its limit and is not flagged.
"""

from __future__ import annotations

from guardctl.analyze.detectors import Flags, deviation_test, register
from guardctl.analyze.features import Features, peer_stats


@register
class Power:
    name = "power"
    defaults = {"rel": 0.15, "z": 5.0, "busy_util_pct": 50.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.gpu
        if not len(t):
            return []
        busy = t["util_med"] >= th["busy_util_pct"]
        value = t["power_lo"]
        med, mad, _ = peer_stats(t["peer"], value, busy)
        hit, rdev, sev = deviation_test(value, med, mad, direction=-1, rel=th["rel"], z=th["z"])
        hit &= busy
        return [
            Flags(
                self.name,
                "power_w",
                "W",
                "power draw below peers under the same load",
                t["w"][hit],
                t["node"][hit],
                value[hit],
                med[hit],
                rdev[hit],
                sev[hit],
                gpu=t["gpu"][hit],
            )
        ]
