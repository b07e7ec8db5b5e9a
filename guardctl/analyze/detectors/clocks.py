"""clocks: a busy GPU running its SM clock below its peers' (throttling, stuck or capped clocks).

Only GPUs under load are judged: an idle GPU clocks down by design.
"""

from __future__ import annotations

from guardctl.analyze.detectors import Flags, deviation_test, register
from guardctl.analyze.features import Features, peer_stats


@register
class Clocks:
    name = "clocks"
    defaults = {"rel": 0.08, "z": 5.0, "busy_util_pct": 50.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.gpu
        if not len(t):
            return []
        busy = t["util_med"] >= th["busy_util_pct"]
        value = t["clock_lo"]
        med, mad, _ = peer_stats(t["peer"], value, busy)
        hit, rdev, sev = deviation_test(value, med, mad, direction=-1, rel=th["rel"], z=th["z"])
        hit &= busy
        return [
            Flags(
                self.name,
                "sm_clock_mhz",
                "MHz",
                "SM clock below peers under load",
                t["w"][hit],
                t["node"][hit],
                value[hit],
                med[hit],
                rdev[hit],
                sev[hit],
                gpu=t["gpu"][hit],
            )
        ]
