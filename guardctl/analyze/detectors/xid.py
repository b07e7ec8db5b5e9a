"""xid: a hardware XID (GPU fell off the bus, double-bit ECC, NVLink, GSP errors) was reported.

An XID arrives once, so a window that saw one keeps the GPU flagged for
``hold_windows`` more windows: a single event then meets the persistence rule,
while application XIDs (13, 31, 43: the job's own fault) never count. The list
of hardware XIDs is ``analyze.hardware_xids``.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, register
from guardctl.analyze.features import Features


def hold(w: np.ndarray, windows: int, n_windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices into *w*, repeated for each newer window they stay flagged in, and those windows."""
    rows, wins = [], []
    for back in range(windows + 1):
        nw = w - back
        ok = nw >= 0
        rows.append(np.flatnonzero(ok))
        wins.append(nw[ok])
    return np.concatenate(rows), np.concatenate(wins)


@register
class Xid:
    name = "xid"
    defaults = {"hold_windows": 2.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.gpu
        if not len(t):
            return []
        idx = np.flatnonzero(t["xid_hw"] > 0)
        rows, wins = hold(t["w"][idx], int(th["hold_windows"]), f.n_windows)
        rows = idx[rows]
        count = t["xid_hw"][rows]
        return [
            Flags(
                self.name,
                "xid",
                "XID",
                "hardware XID reported",
                wins,
                t["node"][rows],
                t["xid"][rows].astype(np.float64),
                np.zeros(rows.size),
                np.full(rows.size, np.nan),
                np.maximum(count, 1.0),
                gpu=t["gpu"][rows],
            )
        ]
