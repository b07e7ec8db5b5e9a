"""host_contention: a training node whose CPU load is far above the other nodes of its job.

A stray process, a runaway data loader or a noisy neighbour slows every rank
on the node; only nodes running a job are judged (an idle node's load is its own).
"""

from __future__ import annotations

from guardctl.analyze.detectors import Flags, deviation_test, register
from guardctl.analyze.features import Features
from guardctl.analyze.groups import peer_stats


@register
class HostContention:
    name = "host_contention"
    defaults = {"rel": 1.0, "z": 5.0, "min_load": 8.0}

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]:
        t = f.host
        if not len(t):
            return []
        busy = f.node_job[t["w"], t["node"]] >= 0
        value = t["load_hi"]
        med, mad, _ = peer_stats(t.grouping("peer"), value, busy)
        hit, rdev, sev = deviation_test(
            value, med, mad, direction=1, rel=th["rel"], z=th["z"], min_abs=th["min_load"]
        )
        hit &= busy
        return [
            Flags.of(
                self.name,
                "load1",
                "load",
                "CPU load far above the job's other nodes",
                t,
                hit,
                value,
                med,
                rdev,
                sev,
            )
        ]
