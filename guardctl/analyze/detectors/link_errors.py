"""link_errors: symbol errors, link-error recoveries or receive errors rising within the window.

Only the counters' increase counts: a port with a large but constant count is
healthy (those counters are never cleared on many fabrics).
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, register
from guardctl.analyze.features import Features


@register
class LinkErrors:
    name = "link_errors"
    defaults = {"errors_per_window": 10.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.nic
        if not len(t):
            return []
        value = t["errors"]
        budget = th["errors_per_window"]
        hit = value >= budget
        n = int(hit.sum())
        return [
            Flags(
                self.name,
                "symbol_errors+link_error_recovery+rcv_errors",
                "errors/window",
                "link errors rising",
                t["w"][hit],
                t["node"][hit],
                value[hit],
                np.full(n, budget),
                np.full(n, np.nan),
                value[hit] / budget,
                port=t["port"][hit],
            )
        ]
