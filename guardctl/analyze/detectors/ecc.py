"""ecc: uncorrectable (double-bit) ECC errors, or correctable ones rising fast, over the window.

Counters are cumulative: only their increase in the window counts, so a GPU
with a large but constant count stays healthy. A double-bit error is held for
``hold_windows`` windows like an XID.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, register
from guardctl.analyze.detectors.xid import hold
from guardctl.analyze.features import Features


@register
class Ecc:
    name = "ecc"
    defaults = {"sbe_per_window": 100.0, "hold_windows": 2.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.gpu
        if not len(t):
            return []
        out = []
        idx = np.flatnonzero(t["ecc_dbe_volatile"] > 0)
        rows, wins = hold(t["w"][idx], int(th["hold_windows"]), f.n_windows)
        rows = idx[rows]
        value = t["ecc_dbe_volatile"][rows]
        out.append(
            Flags(
                self.name,
                "ecc_dbe_volatile",
                "errors/window",
                "uncorrectable ECC errors",
                wins,
                t["node"][rows],
                value,
                np.zeros(rows.size),
                np.full(rows.size, np.nan),
                np.maximum(value, 1.0),
                gpu=t["gpu"][rows],
            )
        )
        sbe = t["ecc_sbe_volatile"]
        hit = sbe >= th["sbe_per_window"]
        out.append(
            Flags(
                self.name,
                "ecc_sbe_volatile",
                "errors/window",
                "correctable ECC errors rising",
                t["w"][hit],
                t["node"][hit],
                sbe[hit],
                np.full(int(hit.sum()), th["sbe_per_window"]),
                np.full(int(hit.sum()), np.nan),
                sbe[hit] / th["sbe_per_window"],
                gpu=t["gpu"][hit],
            )
        )
        return out
