"""gpu_links: PCIe replays or NVLink CRC errors rising on a GPU within the window.

Judged as the counters' increase per window against a fixed budget and the
peers' increase (a whole job's GPUs replaying alike points at something shared).
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, register
from guardctl.analyze.features import Features
from guardctl.analyze.groups import peer_stats

_METRICS = (
    ("pcie_replay", "pcie_per_window", "PCIe replays rising"),
    ("nvlink_crc_errors", "nvlink_per_window", "NVLink CRC errors rising"),
)


@register
class GpuLinks:
    name = "gpu_links"
    defaults = {"pcie_per_window": 50.0, "nvlink_per_window": 20.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.gpu
        if not len(t):
            return []
        out = []
        everyone = np.ones(len(t), bool)
        for metric, key, summary in _METRICS:
            value = t[metric]
            med, _, _ = peer_stats(t.grouping("peer"), value, everyone)
            budget = th[key]
            hit = (value >= budget) & (value >= 4 * med)
            out.append(
                Flags(
                    self.name,
                    metric,
                    "events/window",
                    summary,
                    t["w"][hit],
                    t["node"][hit],
                    value[hit],
                    med[hit],
                    np.full(int(hit.sum()), np.nan),
                    value[hit] / budget,
                    gpu=t["gpu"][hit],
                )
            )
        return out
