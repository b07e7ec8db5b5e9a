"""Injected faults (labelled: the analyzer must find them) and benign confounders (harmless).

Each is a small function registered by name that edits the fleet's arrays from
its onset. Faults are placed on busy nodes (a fault on an idle node cannot slow
training and often cannot be seen); confounders anywhere they make sense.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from guardctl.plugins import Registry
from guardctl.simulate.fleet import GPUS, PORTS, RACK, Fleet


@dataclass(frozen=True)
class Injection:
    """One labelled injection: where, what, from when (and on which GPU / port)."""

    node: str
    kind: str
    onset: float
    gpu: int | None = None
    device: str | None = None
    end: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


FaultFn = Callable[[Fleet, int, int, np.random.Generator], Injection]
ConfounderFn = Callable[[Fleet, np.random.Generator], list[Injection]]
FAULTS: Registry[FaultFn] = Registry("fault")
CONFOUNDERS: Registry[ConfounderFn] = Registry("confounder")
fault = FAULTS.decorator
confounder = CONFOUNDERS.decorator


def _interval(f: Fleet) -> float:
    return max(float(f.t[1] - f.t[0]), 1e-3) if f.t.size > 1 else 10.0


def _port(p: int) -> str:
    return f"mlx5_{p}:1"


def _inj(f: Fleet, node: int, kind: str, i0: int, **kw: Any) -> Injection:
    return Injection(f.names[node], kind, float(f.t[i0]), **kw)


@fault("thermal")
def thermal(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    gpu = int(rng.integers(GPUS))
    s = np.s_[i0:, node, gpu]
    f.g["temp"][s] += 24.0
    f.g["reasons"][s] |= np.where(rng.random(f.g["temp"][s].shape) < 0.9, 0x20 | 0x40, 0)
    f.g["clock"][s] = (f.g["clock"][s] * 0.75).astype(np.int64)
    f.g["power"][s] *= 0.8
    f.slow[s] *= 1.25
    return _inj(f, node, "thermal", i0, gpu=gpu)


@fault("power_brake")
def power_brake(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    s = np.s_[i0:, node, :]
    f.g["reasons"][s] |= 0x80
    f.g["clock"][s] = (f.g["clock"][s] * 0.6).astype(np.int64)
    f.g["power"][s] *= 0.45
    f.slow[s] *= 1.5
    return _inj(f, node, "power_brake", i0)


@fault("slow_gpu")
def slow_gpu(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    """Slow in busy time only: every telemetry signal looks normal."""
    gpu = int(rng.integers(GPUS))
    f.slow[i0:, node, gpu] *= float(rng.uniform(1.12, 1.25))
    return _inj(f, node, "slow_gpu", i0, gpu=gpu)


@fault("stuck_clocks")
def stuck_clocks(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    gpu = int(rng.integers(GPUS))
    s = np.s_[i0:, node, gpu]
    f.g["clock"][s] = 1095
    f.g["power"][s] *= 0.7
    f.slow[s] *= 1.3
    return _inj(f, node, "stuck_clocks", i0, gpu=gpu)


@fault("link_downshift")
def link_downshift(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    p = int(rng.integers(PORTS))
    f.nic["rate"][i0:, node, p] = 200.0
    f.nic["xmit_wait"][i0:, node, p] *= 20
    return _inj(f, node, "link_downshift", i0, device=_port(p))


@fault("link_errors")
def link_errors(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    p = int(rng.integers(PORTS))
    n = f.t.size - i0
    f.nic["symbol_errors"][i0:, node, p] += rng.poisson(4.0, n)
    f.nic["link_error_recovery"][i0:, node, p] += rng.random(n) < 0.1
    return _inj(f, node, "link_errors", i0, device=_port(p))


@fault("link_flaps")
def link_flaps(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    p = int(rng.integers(PORTS))
    i = i0
    step = max(1, round(60.0 / _interval(f)))
    while i < f.t.size:
        f.nic["link_downed"][i, node, p] += 1
        f.nic["down"][i, node, p] = True
        i += step + int(rng.integers(0, step + 1))
    return _inj(f, node, "link_flaps", i0, device=_port(p))


@fault("host_contention")
def host_contention(f: Fleet, node: int, i0: int, rng: np.random.Generator) -> Injection:
    f.h["load"][i0:, node] += rng.uniform(50, 90)
    f.h["cpu"][i0:, node] = rng.uniform(92, 99, f.t.size - i0)
    f.slow[i0:, node, :] *= 1.12
    return _inj(f, node, "host_contention", i0)


# --- benign confounders ------------------------------------------------------------------------


def _window(f: Fleet, rng: np.random.Generator, seconds: float) -> tuple[int, int]:
    length = max(1, int(seconds / _interval(f)))
    i0 = int(rng.integers(0, max(1, f.t.size - length)))
    return i0, min(f.t.size, i0 + length)


@confounder("job_slowdown")
def job_slowdown(f: Fleet, rng: np.random.Generator) -> list[Injection]:
    """A checkpoint or file-system stall: every rank of one job slower at once."""
    if not f.jobs:
        return []
    job = f.jobs[int(rng.integers(len(f.jobs)))]
    i0, i1 = _window(f, rng, 240.0)
    f.slow[i0:i1, job.nodes, :] *= 1.6
    return [
        Injection(f.names[int(n)], "job_slowdown", float(f.t[i0]), end=float(f.t[i1 - 1]))
        for n in job.nodes
    ]


@confounder("warm_rack")
def warm_rack(f: Fleet, rng: np.random.Generator) -> list[Injection]:
    """A rack running 10 C warmer, without throttling."""
    rack = int(rng.integers(max(1, f.n // RACK)))
    nodes = np.arange(rack * RACK, min(f.n, (rack + 1) * RACK))
    f.g["temp"][:, nodes, :] += 10.0
    return [Injection(f.names[int(n)], "warm_rack", float(f.t[0])) for n in nodes]


@confounder("odd_sample")
def odd_sample(f: Fleet, rng: np.random.Generator) -> list[Injection]:
    """One sample of one GPU looks throttled: noise, not a fault."""
    out = []
    for node in rng.choice(f.n, size=min(3, f.n), replace=False):
        i, gpu = int(rng.integers(f.t.size)), int(rng.integers(GPUS))
        f.g["reasons"][i, node, gpu] |= 0x40
        f.g["clock"][i, node, gpu] = 900
        out.append(Injection(f.names[int(node)], "odd_sample", float(f.t[i]), gpu=gpu))
    return out


@confounder("telemetry_gap")
def telemetry_gap(f: Fleet, rng: np.random.Generator) -> list[Injection]:
    """An agent stops writing for four minutes and comes back."""
    out = []
    for node in rng.choice(f.n, size=min(2, f.n), replace=False):
        i0, i1 = _window(f, rng, 240.0)
        f.present[i0:i1, node] = False
        out.append(
            Injection(f.names[int(node)], "telemetry_gap", float(f.t[i0]), end=float(f.t[i1 - 1]))
        )
    return out


@confounder("clock_skew")
def clock_skew(f: Fleet, rng: np.random.Generator) -> list[Injection]:
    """A few nodes whose clocks are tens of seconds off."""
    out = []
    for node in rng.choice(f.n, size=min(3, f.n), replace=False):
        f.skew[node] += float(rng.choice([-1, 1]) * rng.uniform(15, 45))
        out.append(Injection(f.names[int(node)], "clock_skew", float(f.t[0])))
    return out


@confounder("big_counters")
def big_counters(f: Fleet, rng: np.random.Generator) -> list[Injection]:
    """Large but constant error counters (never cleared): history, not a current fault."""
    out = []
    for node in rng.choice(f.n, size=min(4, f.n), replace=False):
        f.nic_base["symbol_errors"][node, :] += 4_000_000_000
        f.nic_base["link_downed"][node, :] += 37
        f.nic_base["xmit_wait"][node, :] += 10**15
        out.append(Injection(f.names[int(node)], "big_counters", float(f.t[0])))
    return out


@confounder("idle_nodes")
def idle_nodes(f: Fleet, rng: np.random.Generator) -> list[Injection]:
    """Idle nodes (low power, low clocks, idle bit) are there by construction: label them."""
    return [Injection(f.names[int(n)], "idle", float(f.t[0])) for n in np.flatnonzero(~f.busy)]


# --- fabric faults -----------------------------------------------------------------------------
# A switch, uplink or cable at fault, seen only through the node-level signals it really
# produces: transmit wait on the ports whose traffic crosses it, symbol errors, downshifts and
# flaps on a bad cable's port, and a slower all-reduce for every job with a node behind it.


@dataclass(frozen=True)
class FabricInjection:
    """One labelled fabric fault: the component, the busy nodes whose signals it changes."""

    component: str  # "leaf:leaf02", "link:node0007" (guardctl.topology.component)
    kind: str
    onset: float
    nodes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "kind": self.kind,
            "onset": self.onset,
            "nodes": list(self.nodes),
        }


# (fleet, the switch or node it is placed on, onset sample, rng)
FabricFn = Callable[[Fleet, str, int, np.random.Generator], FabricInjection]
FABRIC: Registry[FabricFn] = Registry("fabric fault")
fabric_fault = FABRIC.decorator
# What each fabric fault is placed on: a leaf, a spine or a node.
FABRIC_PLACE = {
    "leaf_degraded": "leaf",
    "uplink_flapping": "leaf",
    "spine_congested": "spine",
    "bad_cable": "node",
}


def talking(f: Fleet) -> np.ndarray:
    """(N,) nodes in jobs of two or more nodes: the only ones whose traffic crosses the fabric."""
    out = np.zeros(f.n, bool)
    for job in f.jobs:
        if job.nodes.size >= 2:
            out[job.nodes] = True
    return out


def leaving(f: Fleet, inside: np.ndarray) -> np.ndarray:
    """(N,) nodes of *inside* (a mask) whose job has a node outside it: traffic leaving."""
    out = np.zeros(f.n, bool)
    for job in f.jobs:
        mask = inside[job.nodes]
        if job.nodes.size >= 2 and mask.any() and not mask.all():
            out[job.nodes[mask]] = True
    return out


def _mask(f: Fleet, nodes: tuple[str, ...]) -> np.ndarray:
    index = {name: i for i, name in enumerate(f.names)}
    out = np.zeros(f.n, bool)
    out[[index[n] for n in nodes]] = True
    return out


def _scale(a: np.ndarray, where: Any, factor: float) -> None:
    """Multiply a counter's increments by *factor*, keeping them whole."""
    a[where] = np.rint(a[where] * factor).astype(a.dtype)


def _fabric(f: Fleet, comp: str, kind: str, i0: int, hit: np.ndarray) -> FabricInjection:
    return FabricInjection(
        comp, kind, float(f.t[i0]), tuple(f.names[int(i)] for i in np.flatnonzero(hit))
    )


@fabric_fault("leaf_degraded")
def leaf_degraded(f: Fleet, leaf: str, i0: int, rng: np.random.Generator) -> FabricInjection:
    """A leaf switch gone slow (a failing ASIC, a throttling switch): every busy port under it
    waits for credits, and every job with a node on it all-reduces slower."""
    hit = _mask(f, f.topology.switches[leaf].nodes) & talking(f)
    _scale(f.nic["xmit_wait"], np.s_[i0:, hit, :], rng.uniform(25.0, 50.0))
    f.comm[i0:, hit] *= rng.uniform(1.3, 1.6)
    return _fabric(f, f"leaf:{leaf}", "leaf_degraded", i0, hit)


@fabric_fault("uplink_flapping")
def uplink_flapping(f: Fleet, leaf: str, i0: int, rng: np.random.Generator) -> FabricInjection:
    """A leaf's uplink going down and up: for 30-60 s every 6-12 minutes, the traffic leaving
    the leaf stalls while routes change (transmit wait and all-reduce stalls on the leaf's
    nodes whose jobs reach other leaves); traffic inside the leaf is untouched."""
    hit = leaving(f, _mask(f, f.topology.switches[leaf].nodes))
    step = _interval(f)
    i = i0
    while i < f.t.size:
        i1 = min(f.t.size, i + max(1, round(rng.uniform(30.0, 60.0) / step)))
        f.nic["xmit_wait"][i:i1, hit, :] *= 60
        f.comm[i:i1, hit] *= 3.0
        i += max(1, round(rng.uniform(360.0, 720.0) / step))
    return _fabric(f, f"uplink:{leaf}", "uplink_flapping", i0, hit)


@fabric_fault("spine_congested")
def spine_congested(f: Fleet, spine: str, i0: int, rng: np.random.Generator) -> FabricInjection:
    """A spine switch's group congested (a bad spine, too little bisection): transmit wait on
    every port beneath it whose traffic leaves its leaf, and slower all-reduces."""
    topo = f.topology
    hit = np.zeros(f.n, bool)
    for leaf in topo.switches[spine].switches:
        hit |= leaving(f, _mask(f, topo.switches[leaf].nodes))
    _scale(f.nic["xmit_wait"], np.s_[i0:, hit, :], rng.uniform(15.0, 30.0))
    f.comm[i0:, hit] *= rng.uniform(1.2, 1.4)
    return _fabric(f, f"spine:{spine}", "spine_congested", i0, hit)


@fabric_fault("bad_cable")
def bad_cable(f: Fleet, node: str, i0: int, rng: np.random.Generator) -> FabricInjection:
    """One node's cable going bad: symbol errors and recoveries, the port trained down to half
    its width (200 Gb/s), a flap every few minutes, its transmit wait up; its job slower."""
    n = f.names.index(node)
    p = int(rng.integers(PORTS))
    count = f.t.size - i0
    f.nic["symbol_errors"][i0:, n, p] += rng.poisson(6.0, count)
    f.nic["link_error_recovery"][i0:, n, p] += rng.random(count) < 0.05
    f.nic["rate"][i0:, n, p] = 200.0
    f.nic["xmit_wait"][i0:, n, p] *= 10
    step = max(1, round(180.0 / _interval(f)))
    f.nic["link_downed"][i0::step, n, p] += 1
    f.nic["down"][i0::step, n, p] = True
    f.comm[i0:, n] *= 1.15
    return FabricInjection(f"link:{node}", "bad_cable", float(f.t[i0]), (node,))
