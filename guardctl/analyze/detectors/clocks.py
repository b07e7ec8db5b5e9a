"""clocks: a busy GPU running its SM clock below its peers' (throttling, stuck or capped clocks).

Only GPUs under load are judged: an idle GPU clocks down by design.
"""

from __future__ import annotations

from guardctl.analyze.detectors import Flags, below_peers_under_load, register
from guardctl.analyze.features import Features


@register
class Clocks:
    name = "clocks"
    defaults = {"rel": 0.08, "z": 5.0, "busy_util_pct": 50.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        return below_peers_under_load(
            self.name, f, th, "clock_lo", "sm_clock_mhz", "MHz", "SM clock below peers under load"
        )
