"""The fault processes: when each node crashes, slows down or is grey, drawn once per seed.

Every policy of one seed sees the same schedule (it is drawn before any policy acts, from its
own random stream), so the policies are compared on the same faults. Rates are in
:class:`~guardctl.simulate.cluster.params.Params`, each with its source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from guardctl.simulate.cluster.fabric import counts
from guardctl.simulate.cluster.params import DAY, Params


@dataclass(frozen=True)
class Onset:
    """One fault event: a node starts (or, for a lemon's phase, stops) being at fault."""

    at: float
    node: int
    kind: str  # crash, gpu_lost, failslow, grey, lemon_on, contention, false_positive; the
    # fabric's: cable (one node's link), leaf, uplink, spine (every node beneath the switch)
    factor: float = 1.0  # how much slower the node runs
    duration_s: float = 0.0  # for the transient kinds; 0: until repaired
    # The analyzer's detectors that see it, beside busy time (the job's own measurement):
    # a compute fail-slow is the GPU throttling (clock events), a communication one shows as
    # transmit wait on the node's links (FALCON); host contention is its own detector.
    detectors: tuple[str, ...] = ("busy_time",)
    switch: int = -1  # a switch fault's leaf (leaf, uplink) or spine group (spine); node: -1


@dataclass
class Schedule:
    """Every fault of one run, and the per-node facts a sweep reads (grey reveal times)."""

    onsets: list[Onset] = field(default_factory=list)
    reveal_s: dict[int, float] = field(default_factory=dict)


def poisson_times(rng: np.random.Generator, rate_per_s: float, horizon: float) -> np.ndarray:
    if rate_per_s <= 0:
        return np.empty(0)
    count = rng.poisson(rate_per_s * horizon)
    return np.sort(rng.uniform(0.0, horizon, count))


def _slow(rng: np.random.Generator, p: Params) -> float:
    return float(rng.uniform(p.slow_low, p.slow_high))


def draw(p: Params, rng: np.random.Generator) -> Schedule:
    """The fault schedule of one run."""
    out = Schedule()
    horizon, n = p.horizon_s, p.nodes
    per_node_s = n / DAY / 1000.0  # a rate per 1000 node-days -> events per second, fleet-wide
    for t in poisson_times(rng, p.failstop_per_1000_node_days * per_node_s, horizon):
        kind = "gpu_lost" if rng.random() < p.failstop_gpu_share else "crash"
        out.onsets.append(Onset(float(t), int(rng.integers(n)), kind))
    for t in poisson_times(rng, p.failslow_per_1000_node_days * per_node_s, horizon):
        comm = rng.random() < p.failslow_comm_share
        mean = p.failslow_comm_mean_s if comm else p.failslow_compute_mean_s
        length = float(np.clip(rng.exponential(mean), p.failslow_min_s, p.failslow_max_s))
        signal = "xmit_wait" if comm else "clock_events"
        out.onsets.append(
            Onset(
                float(t),
                int(rng.integers(n)),
                "failslow",
                _slow(rng, p),
                length,
                ("busy_time", signal),
            )
        )
    greys = [int(x) for x in rng.choice(n, size=round(p.grey_share * n), replace=False)]
    later = poisson_times(rng, p.grey_per_1000_node_days * per_node_s, horizon)
    for node, t in [(g, 0.0) for g in greys] + [(int(rng.integers(n)), float(t)) for t in later]:
        out.onsets.append(Onset(t, node, "grey", _slow(rng, p)))
        out.reveal_s[node] = float(rng.exponential(p.grey_reveal_mean_s))
    for node in rng.choice(n, size=round(p.lemon_share * n), replace=False):
        factor, t = _slow(rng, p), float(rng.exponential(p.lemon_off_mean_s))
        while t < horizon:
            on = float(rng.exponential(p.lemon_on_mean_s))
            out.onsets.append(Onset(t, int(node), "lemon_on", factor, on))
            t += on + float(rng.exponential(p.lemon_off_mean_s))
    for t in poisson_times(rng, p.contention_per_node_day * n / DAY, horizon):
        out.onsets.append(
            Onset(
                float(t),
                int(rng.integers(n)),
                "contention",
                p.contention_slow,
                float(rng.exponential(p.contention_mean_s)),
                ("busy_time", "host_contention"),
            )
        )
    # Last, so that every draw above is the same with or without them: the analyzer's false
    # suspects, healthy nodes it calls slow at one pass (a property of the analyzer, not of the
    # fleet's faults: scaled() leaves them be).
    for t in poisson_times(rng, p.false_positive_per_node_pass * n / p.pass_s, horizon):
        out.onsets.append(Onset(float(t), int(rng.integers(n)), "false_positive"))
    if p.fabric:
        out.onsets += fabric(p, np.random.default_rng([p.seed, 3]))
    out.onsets.sort(key=lambda o: (o.at, o.node, o.kind, o.switch))
    return out


# What the analyzer sees of a fabric fault: a switch's fault backs up the transmit queues of
# the nodes beneath it (transmit wait, FALCON's signal of a communication fail-slow), with no
# error on their own ports; a bad cable shows its errors on the one node's port as well. Their
# ranks' busy time is not behind their peers': every rank of the job waits on the collective.
SWITCH_DETECTORS = ("xmit_wait",)
CABLE_DETECTORS = ("link_errors", "xmit_wait")


def fabric(p: Params, rng: np.random.Generator) -> list[Onset]:
    """The fabric faults of one run, from their own random stream (the node faults above are
    the same with them or without)."""
    out: list[Onset] = []
    horizon, n = p.horizon_s, p.nodes
    leaves, groups = counts(n, p.leaf_nodes, p.spine_leaves)

    def length(mean: float) -> float:
        return float(np.clip(rng.exponential(mean), p.failslow_min_s, p.failslow_max_s))

    for t in poisson_times(rng, p.leaf_per_100_leaf_days / 100.0 * leaves / DAY, horizon):
        where, slow = int(rng.integers(leaves)), _slow(rng, p)
        out.append(
            Onset(float(t), -1, "leaf", slow, length(p.leaf_mean_s), SWITCH_DETECTORS, where)
        )
    for t in poisson_times(rng, p.uplink_per_100_leaf_days / 100.0 * leaves / DAY, horizon):
        where, slow, end = (
            int(rng.integers(leaves)),
            _slow(rng, p),
            float(t) + length(p.uplink_mean_s),
        )
        at = float(t)
        while at < min(end, horizon):  # degraded while a flap settles, then well a while
            on = float(rng.exponential(p.uplink_on_mean_s))
            out.append(Onset(at, -1, "uplink", slow, on, SWITCH_DETECTORS, where))
            at += on + float(rng.exponential(p.uplink_off_mean_s))
    for t in poisson_times(rng, p.spine_per_10_group_days / 10.0 * groups / DAY, horizon):
        where, slow = int(rng.integers(groups)), _slow(rng, p)
        out.append(
            Onset(float(t), -1, "spine", slow, length(p.spine_mean_s), SWITCH_DETECTORS, where)
        )
    for t in poisson_times(rng, p.cable_per_1000_node_days * n / DAY / 1000.0, horizon):
        out.append(
            Onset(float(t), int(rng.integers(n)), "cable", _slow(rng, p), 0.0, CABLE_DETECTORS)
        )
    return out
