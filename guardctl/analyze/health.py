"""The node agents' own health, from their ``agent`` records: which collector works where.

Each sample the agent writes one ``agent`` record per collector (success,
state, duration of its last sample, error). The analyzer uses the newest one
of each collector in the newest window to tell "collector broken" from "no
data": a node whose collector fails is ``unknown`` with that reason, not a
silent "too little data". ``guardctl export`` turns them into node_exporter's
``*_collector_success`` and ``*_collector_duration_seconds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from guardctl.analyze.frame import Frame

# A collector that cannot run on a node (no driver, no InfiniBand) is not failing
# there if it never ran there: a CPU-only node has no NVML to run. Once it has run,
# "no NVIDIA driver" is a driver lost.
ABSENT = "unavailable"


@dataclass(frozen=True)
class CollectorStatus:
    """The newest health record of one collector on one node."""

    node: str
    collector: str
    ts: float
    ok: bool
    state: str
    duration_s: float
    error: str

    @property
    def reason(self) -> str:
        """The verdict reason of a collector that fails."""
        return f"collector {self.collector} failing: {self.error or self.state or 'not ok'}"


def latest(frame: Frame, start: float = -math.inf, end: float = math.inf) -> list[CollectorStatus]:
    """Per node and collector, its newest health record with ``start <= ts <= end``."""
    cols = frame.cols["agent"]
    keep = np.flatnonzero((cols["ts"] >= start) & (cols["ts"] <= end))
    if not keep.size:
        return []
    node, collector, ts = cols["node"][keep], cols["collector"][keep], cols["ts"][keep]
    # newest last within each (node, collector): the last row of each group after sorting
    order = np.lexsort((ts, collector, node))
    last = np.ones(order.size, bool)
    last[:-1] = (node[order][1:] != node[order][:-1]) | (
        collector[order][1:] != collector[order][:-1]
    )
    rows = keep[order[last]]
    # Each column read once (the incremental analyzer's kept columns unpack as read).
    picked = {
        name: cols[name][rows].tolist()
        for name in ("node", "collector", "ts", "ok", "state", "duration_s", "error")
    }
    out = []
    for node_i, coll, t, ok, state, duration, error in zip(*picked.values(), strict=True):
        out.append(
            CollectorStatus(
                node=frame.nodes[node_i],
                collector=frame.collectors[coll],
                ts=t,
                ok=ok == 1,
                state=frame.states[state] if state >= 0 else "",
                duration_s=duration if math.isfinite(duration) else math.nan,
                error=frame.errors[error] if error >= 0 else "",
            )
        )
    return out


def ever_ok(frame: Frame, end: float = math.inf) -> set[tuple[str, str]]:
    """The (node, collector) pairs with a successful sample at or before *end*."""
    cols = frame.cols["agent"]
    keep = (cols["ok"] == 1) & (cols["ts"] <= end)
    pairs = set(zip(cols["node"][keep].tolist(), cols["collector"][keep].tolist(), strict=True))
    return {(frame.nodes[n], frame.collectors[c]) for n, c in pairs}


def failing(
    frame: Frame, start: float, end: float, has_data: dict[str, bool]
) -> dict[str, list[str]]:
    """Per node, the reasons of its collectors failing in [start, end], in collector order.

    A collector fails where its newest record there is not ok; one that is
    ``unavailable`` only where it has worked before, or where the node lacks
    data (it explains the gap).
    """
    newest = latest(frame, start, end)
    if all(h.ok for h in newest):
        return {}
    worked = ever_ok(frame, end)
    out: dict[str, list[str]] = {}
    for h in sorted(newest, key=lambda h: (h.node, h.collector)):
        if h.ok:
            continue
        if (
            h.state == ABSENT
            and has_data.get(h.node, False)
            and (h.node, h.collector) not in worked
        ):
            continue
        out.setdefault(h.node, []).append(h.reason)
    return out
