"""link_rate: a network port running below its peers' rate (e.g. a 400 -> 200 Gb/s downshift).

Peers are all ports seen in the same window: the fabric's ports share one speed.
"""

from __future__ import annotations

from guardctl.analyze.detectors import Flags, deviation_test, register
from guardctl.analyze.features import Features
from guardctl.analyze.groups import peer_stats


@register
class LinkRate:
    name = "link_rate"
    defaults = {"rel": 0.2, "z": 3.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.nic
        if not len(t):
            return []
        value = t["rate_lo"]
        up = t["down_frac"] < 0.5  # a port that is down is link_flaps' business
        med, mad, _ = peer_stats(t.grouping("w"), value, up)
        hit, rdev, sev = deviation_test(value, med, mad, direction=-1, rel=th["rel"], z=th["z"])
        hit &= up
        return [
            Flags.of(
                self.name,
                "rate_gbps",
                "Gb/s",
                "link rate below peers",
                t,
                hit,
                value,
                med,
                rdev,
                sev,
                port="port",
            )
        ]
