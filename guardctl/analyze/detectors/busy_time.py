"""busy_time: a rank that computes longer than the other ranks of its job (a slow GPU or host).

In synchronous data-parallel training every rank's step time is the same (all
wait for the slowest), so the straggler shows in its busy time (``compute_s``),
not in ``step_s``. Comparing ranks of the same job in the same window makes a
whole job slowing at once (checkpoint, file-system stall) a non-event. Where
step records say how many samples a step was, busy time per sample is
compared (per-step data sharding gives a slow rank fewer samples, and then a
normal ``compute_s``); where they say the rank's parallel role, a rank is
compared only with the ranks doing the same work: the data-parallel replicas of
its pipeline stage and tensor-parallel rank, or with too few of those, its stage
(stages differ by construction). A rank without enough such peers is left to
:mod:`busy_history`.
"""

from __future__ import annotations

import numpy as np

from guardctl.analyze.detectors import Flags, busy_flags, deviation_test, register
from guardctl.analyze.features import Features
from guardctl.analyze.groups import peer_stats


@register
class BusyTime:
    name = "busy_time"
    defaults = {"rel": 0.06, "z": 5.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.rank
        if not len(t):
            return []
        value = t["busy_hi"]
        med, mad, _ = peer_stats(t.grouping("peer"), value, np.ones(len(t), bool))
        hit, rdev, sev = deviation_test(value, med, mad, direction=1, rel=th["rel"], z=th["z"])
        hit &= t["peer"] >= 0  # a job too small to have peers is not judged
        return busy_flags(self.name, t, hit, value, med, rdev, sev, "its job's ranks")
