"""xmit_wait: a port waiting to transmit far longer than its job's other ports (weak link).

Judged on the counter's increase in the window against the peers' median, with
an absolute floor so that near-idle ports never trip it.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, deviation_test, register
from guardctl.analyze.features import Features
from guardctl.analyze.groups import peer_stats


@register
class XmitWait:
    name = "xmit_wait"
    defaults = {"ratio": 5.0, "z": 5.0, "min_per_window": 1e6}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.nic
        if not len(t):
            return []
        value = t["xmit_wait"]
        med, mad, _ = peer_stats(t.grouping("peer"), value, np.ones(len(t), bool))
        hit, rdev, sev = deviation_test(
            value,
            med,
            mad,
            direction=1,
            rel=th["ratio"] - 1,
            z=th["z"],
            min_abs=th["min_per_window"],
        )
        # the peers' median may be 0 (idle fabric): then the absolute floor decides
        zero = (med <= 0) & (value >= th["min_per_window"])
        hit |= zero
        sev = np.where(zero, value / th["min_per_window"], sev)
        return [
            Flags.of(
                self.name,
                "xmit_wait",
                "ticks/window",
                "transmit wait far above peers",
                t,
                hit,
                value,
                med,
                rdev,
                sev,
                port="port",
            )
        ]
