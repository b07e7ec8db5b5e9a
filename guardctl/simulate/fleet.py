"""The simulated fleet's healthy behaviour: nodes, racks, jobs, and every signal as arrays.

Arrays are shaped (samples, nodes[, GPUs or ports]); faults and confounders
(:mod:`guardctl.simulate.faults`) edit them in place from their onset, and
:mod:`guardctl.simulate.writer` turns them into schema-v1 lines. Values follow
an H100/H200 fleet on 400G InfiniBand: busy GPUs at ~1980 MHz and 550-690 W,
idle ones at 345 MHz and ~70 W with the idle clock-event bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from guardctl.topology import Switch, Topology

GPUS = 8
PORTS = 4
RACK = 16  # nodes per rack
LEAF = 8  # nodes per leaf switch of the network tree
LEAVES_PER_SPINE = 2  # leaves under each spine switch; the spines under one core
BOOST_MHZ = 1980
IDLE_MHZ = 345
POWER_LIMIT_W = 700.0


@dataclass
class Job:
    """A training job: its nodes, base step time and per-step compute share."""

    name: str
    nodes: np.ndarray  # node indices
    step_s: float
    compute_share: float  # compute_s / step_s of a healthy rank
    start: float


@dataclass
class Fleet:
    """Every signal of every node over the trace, before faults are added."""

    names: list[str]
    t: np.ndarray  # (T,) sample times
    skew: np.ndarray  # (N,) clock offset of each node's timestamps
    jobs: list[Job]
    busy: np.ndarray  # (N,) node runs a job
    g: dict[str, np.ndarray] = field(default_factory=dict)  # (T, N, GPUS)
    h: dict[str, np.ndarray] = field(default_factory=dict)  # (T, N)
    nic: dict[str, np.ndarray] = field(default_factory=dict)  # (T, N, PORTS) increments
    nic_base: dict[str, np.ndarray] = field(default_factory=dict)  # (N, PORTS) starting values
    present: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # (T, N)
    slow: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T, N, GPUS) compute factor
    # (T, N) factor on the all-reduce of any job with the node (its slowest link sets the pace)
    comm: np.ndarray = field(default_factory=lambda: np.zeros(0))
    leaf_size: int = LEAF

    @property
    def n(self) -> int:
        return len(self.names)

    def index_at(self, ts: float) -> int:
        return int(np.searchsorted(self.t, ts))

    @property
    def topology(self) -> Topology:
        return tree(self.names, self.leaf_size)

    def job_of(self) -> np.ndarray:
        """(N,) each node's job index, -1 for an idle node."""
        out = np.full(self.n, -1)
        for j, job in enumerate(self.jobs):
            out[job.nodes] = j
        return out


def tree(
    names: list[str], leaf_size: int = LEAF, leaves_per_spine: int = LEAVES_PER_SPINE
) -> Topology:
    """A fat tree by node order: *leaf_size* nodes per leaf (``leaf01``...),
    *leaves_per_spine* leaves per spine (``spine01``...), every spine under ``core``."""
    leaves = [names[i : i + leaf_size] for i in range(0, len(names), leaf_size)]
    width = max(2, len(str(len(leaves))))
    leaf_names = [f"leaf{i + 1:0{width}d}" for i in range(len(leaves))]
    switches = {n: Switch(n, tuple(nodes)) for n, nodes in zip(leaf_names, leaves, strict=True)}
    spines = []
    for i in range(0, len(leaf_names), leaves_per_spine):
        name = f"spine{i // leaves_per_spine + 1:0{width}d}"
        switches[name] = Switch(name, (), tuple(leaf_names[i : i + leaves_per_spine]))
        spines.append(name)
    switches["core"] = Switch("core", (), tuple(spines))
    return Topology(switches, "simulated")


def node_names(count: int) -> list[str]:
    width = max(4, len(str(count)))
    return [f"node{i + 1:0{width}d}" for i in range(count)]


def _jobs(rng: np.random.Generator, n: int, start: float) -> tuple[list[Job], np.ndarray]:
    """Split about 85% of the nodes into jobs of different sizes; the rest stay idle."""
    order = rng.permutation(n)
    busy_count = round(n * 0.85)
    jobs: list[Job] = []
    at = 0
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    while at < busy_count:
        room = busy_count - at
        fits = [s for s in sizes if s <= max(room, 1) and s <= max(2, n // 4)]
        size = min(int(rng.choice(fits)), room)
        nodes = np.sort(order[at : at + size])
        jobs.append(
            Job(
                f"job{len(jobs) + 1:04d}",
                nodes,
                float(rng.uniform(4.0, 14.0)),
                float(rng.uniform(0.55, 0.8)),
                start,
            )
        )
        at += size
    busy = np.zeros(n, bool)
    busy[order[:busy_count]] = True
    return jobs, busy


def build(n: int, duration: float, interval: float, seed: int, start: float) -> Fleet:
    """A healthy fleet of *n* nodes sampled every *interval* seconds for *duration*."""
    rng = np.random.default_rng(seed)
    t = start + np.arange(0.0, duration, interval)
    T = t.size
    jobs, busy = _jobs(rng, n, start)
    fleet = Fleet(node_names(n), t, rng.normal(0.0, 0.5, n), jobs, busy)
    fleet.present = np.ones((T, n), bool)
    fleet.slow = np.ones((T, n, GPUS))
    fleet.comm = np.ones((T, n))
    shape = (T, n, GPUS)
    b = busy[None, :, None]
    job_power = np.full(n, 80.0)
    for job in jobs:
        job_power[job.nodes] = rng.uniform(550.0, 690.0)
    rack_temp = rng.uniform(-3.0, 3.0, (n + RACK - 1) // RACK).repeat(RACK)[:n]
    gpu_temp = rng.normal(0.0, 2.0, (n, GPUS))
    g = fleet.g
    g["util"] = np.where(b, rng.integers(95, 101, shape), rng.integers(0, 2, shape))
    g["clock"] = np.where(b, BOOST_MHZ - rng.integers(0, 30, shape), IDLE_MHZ)
    g["power"] = np.where(
        b, job_power[None, :, None] + rng.normal(0, 8, shape), rng.normal(72, 3, shape)
    )
    g["limit"] = np.full(shape, POWER_LIMIT_W)
    g["temp"] = (
        np.where(b, 66.0, 33.0)
        + rack_temp[None, :, None]
        + gpu_temp[None]
        + rng.normal(0, 0.8, shape)
    )
    # normal clock-event bits: idle 0x1 when idle; SW power cap 0x4 now and then, sync boost 0x10
    cap = rng.random(shape) < 0.3
    g["reasons"] = np.where(b, np.where(cap, 0x4, 0) | 0x10 * (rng.random(shape) < 0.1), 0x1)
    for name in ("sbe", "dbe", "pcie", "nvlink"):
        g[name] = np.zeros(shape, np.int64)  # increments; made cumulative when written
    g["xid"] = np.full(shape, -1, np.int64)
    h = fleet.h
    hb = busy[None, :]
    h["cpu"] = np.where(hb, rng.uniform(25, 40, (T, n)), rng.uniform(0.5, 3, (T, n)))
    h["load"] = np.where(hb, rng.uniform(12, 20, (T, n)), rng.uniform(0.05, 1.0, (T, n)))
    h["mem"] = np.where(hb, rng.uniform(40, 60, (T, n)), rng.uniform(5, 10, (T, n)))
    nshape = (T, n, PORTS)
    nb = busy[None, :, None]
    fleet.nic = {
        "rate": np.full(nshape, 400.0),
        "down": np.zeros(nshape, bool),
        "symbol_errors": np.zeros(nshape, np.int64),
        "link_error_recovery": np.zeros(nshape, np.int64),
        "link_downed": np.zeros(nshape, np.int64),
        "rcv_errors": np.zeros(nshape, np.int64),
        "xmit_wait": np.where(nb, rng.integers(5_000, 30_000, nshape), 0).astype(np.int64),
        "xmit_bytes": np.where(
            nb, rng.integers(10**9, 4 * 10**9, nshape), rng.integers(0, 10**5, nshape)
        ).astype(np.int64),
    }
    fleet.nic_base = {
        k: rng.integers(0, 100, (n, PORTS)) for k in fleet.nic if k not in ("rate", "down")
    }
    return fleet
