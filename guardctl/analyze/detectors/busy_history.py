"""busy_history: a rank too few peers can judge that computes longer than it did before.

A job of two ranks (or a role with too few ranks) has no peers that can say which
rank is slow (:mod:`busy_time` leaves it alone). Its ranks still have their own
history: the lowest busy time each had in the job's earlier windows
(``[analyze] own_history``). A rank is flagged when it computes ``rel`` above
that reference while another rank of its job holds within ``steady`` of its
own: a whole job slowing down (a new phase, longer sequences, a checkpoint) moves
every rank, a bad node only its own. A one-rank job has no such witness and is
not judged; nor is a rank slow since before its history began.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, register
from guardctl.analyze.features import Features, Table

_NONE = np.inf


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
        others = _others_best(t, ratio)
        hit = (t["peer"] < 0) & (ratio >= 1 + th["rel"]) & (others <= 1 + th["steady"])
        rdev = ratio - 1
        sev = np.where(hit, rdev / max(th["rel"], 1e-9), 0.0)
        per = t["per_sample"]
        return [
            Flags.of(self.name, field, unit, text, t, hit & rows, value, ref, rdev, sev,
                     gpu="local", rank="rank")
            for field, unit, text, rows in (
                ("compute_s", "s", "rank busy time above its own earlier windows", ~per),
                ("compute_s_per_sample", "s/sample",
                 "rank busy time per sample above its own earlier windows", per),
            )
        ]


def _others_best(t: Table, ratio: np.ndarray) -> np.ndarray:
    """Per row: the lowest ratio to its own reference among the other ranks of its job and
    window (inf where none has one)."""
    key = t["w"] * (int(t["job"].max(initial=0)) + 1) + t["job"]
    _, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1)
    r = np.where(np.isfinite(ratio), ratio, _NONE)
    least = np.full(int(group.max(initial=-1)) + 1, _NONE)
    np.minimum.at(least, group, r)
    # the one row per group that holds the least: its witness is the group's second least
    holder = np.zeros(r.size, bool)
    at_least = np.flatnonzero(r == least[group])
    _, first = np.unique(group[at_least], return_index=True)
    holder[at_least[first]] = True
    second = np.full(least.size, _NONE)
    np.minimum.at(second, group[~holder], r[~holder])
    return np.where(holder, second[group], least[group])
