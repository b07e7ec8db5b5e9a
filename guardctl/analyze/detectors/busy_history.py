"""busy_history: a rank too few peers can judge that computes longer than it did before.

A job of two ranks (or a role with too few ranks) has no peers that can say which
rank is slow (:mod:`busy_time` leaves it alone). Its ranks still have their own
history: the lowest busy time each had in the job's earlier windows
(``[analyze] own_history``). A rank is flagged when it computes ``rel`` above
that reference while another rank of its job holds within ``steady`` of its
own, neither slower nor faster: a whole job slowing down (a new phase, longer
sequences, a checkpoint) moves every rank, work moved from one rank to another
(uneven shares the records do not count) moves both, a bad node only its own.
A one-rank job has no such witness and is not judged; nor is a rank slow since
before its history began.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, busy_flags, register
from guardctl.analyze.features import Features, Table


@register
class BusyHistory:
    name = "busy_history"
    defaults = {"rel": 0.25, "steady": 0.1}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.rank
        if not len(t):
            return []
        value, ref = t["busy_hi"], t["own_ref"]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(ref > 0, value / ref, np.nan)
        witness = _witnessed(t, ratio, th["steady"])
        hit = (t["peer"] < 0) & (ratio >= 1 + th["rel"]) & witness
        rdev = ratio - 1
        sev = np.where(hit, rdev / max(th["rel"], 1e-9), 0.0)
        return busy_flags(self.name, t, hit, value, ref, rdev, sev, "its own earlier windows")


def _witnessed(t: Table, ratio: np.ndarray, steady: float) -> np.ndarray:
    """Per row: whether another rank of its job held its pace in that window (its busy
    time within *steady* of its own reference, neither slower nor faster: a rank that
    got faster may have taken over work, a share the records do not count)."""
    key = t["w"] * (int(t["job"].max(initial=0)) + 1) + t["job"]
    _, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1)
    with np.errstate(invalid="ignore"):
        held = np.abs(ratio - 1) <= steady  # NaN (no reference): False
    count = np.bincount(group, weights=held.astype(np.float64))
    return count[group] - held > 0
