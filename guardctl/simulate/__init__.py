"""Simulated fleets: schema-v1 traces with labelled faults and benign confounders, and the truth.

``simulate(out, ...)`` builds a fleet (:mod:`.fleet`), injects faults and
confounders (:mod:`.faults`), writes the records in the store layout
(:mod:`.writer`) so that ``guardctl analyze --input OUT`` reads them, and writes
``OUT/truth.json``: every fault's node, kind and onset, and every confounder. Fabric faults
(a degraded leaf, a flapping uplink, a congested spine group, one bad cable) sit beside the
node faults on the fleet's network tree (:func:`.fleet.tree`, also written as
``OUT/topology.conf`` in Slurm's topology/tree syntax); truth.json names their component.
Seeded: the same arguments give the same trace.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from guardctl.errors import StoreError, UsageError
from guardctl.fileio import atomic_write
from guardctl.simulate import faults as F
from guardctl.simulate.fleet import LEAF, Fleet, build
from guardctl.simulate.writer import write_fleet

DEFAULT_START = 1_764_547_200.0  # 2025-12-01T00:00:00Z: fixed, so traces are reproducible


@dataclass
class Truth:
    """What was injected, to score the analyzer against."""

    seed: int
    nodes: list[str]
    start: float
    end: float
    interval: float
    faults: list[F.Injection] = field(default_factory=list)
    confounders: list[F.Injection] = field(default_factory=list)
    records: int = 0
    fabric: list[F.FabricInjection] = field(default_factory=list)
    leaf_size: int = LEAF

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "nodes": len(self.nodes),
            "start": self.start,
            "end": self.end,
            "interval": self.interval,
            "records": self.records,
            "faults": [i.to_dict() for i in self.faults],
            "confounders": [i.to_dict() for i in self.confounders],
            "leaf_size": self.leaf_size,
            "fabric": [i.to_dict() for i in self.fabric],
        }

    @property
    def faulty(self) -> dict[str, F.Injection]:
        return {i.node: i for i in self.faults}


def parse_faults(spec: str) -> dict[str, int]:
    """``thermal:2,link_flaps`` / ``all`` / ``all:3`` / ``none`` -> {fault: count}."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, count = part.partition(":")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise UsageError(f"--faults: bad count in {part!r}") from None
        if n < 0:
            raise UsageError(f"--faults: negative count in {part!r}")
        if name == "none":
            continue
        if name != "all" and name not in F.FABRIC:
            F.FAULTS.get(name, "--faults")  # an unknown name is a usage error
        for one in F.FAULTS.names() if name == "all" else [name]:
            out[one] = out.get(one, 0) + n
    return out


def split_pinned(spec: str) -> tuple[str, list[tuple[str, str]]]:
    """``slow_gpu@node3,thermal:2`` -> (``thermal:2``, [(``slow_gpu``, ``node3``)])."""
    rest, pinned = [], []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, at, node = part.partition("@")
        if not at:
            rest.append(part)
        else:
            if name not in F.FABRIC:
                F.FAULTS.get(name, "--faults")  # an unknown name is a usage error
            pinned.append((name, node))
    return ",".join(rest) or "none", pinned


def _place_faults(
    fleet: Any,
    wanted: dict[str, int],
    rng: np.random.Generator,
    onset_range: tuple[float, float],
    pinned: Sequence[tuple[str, str]] = (),
) -> list[F.Injection]:
    # one fault per node, on nodes of jobs with peers (a fault must be able to slow training)
    candidates = [int(n) for job in fleet.jobs if job.nodes.size >= 2 for n in job.nodes]
    rng.shuffle(candidates)
    placed: list[tuple[str, int]] = []
    for name, wanted_node in pinned:
        index = fleet.names.index(wanted_node) if wanted_node in fleet.names else -1
        if index not in candidates:
            raise UsageError(
                f"--faults: {name}@{wanted_node}: {wanted_node} is not a busy node in a job "
                "of two or more in this trace (try another --seed)"
            )
        candidates.remove(index)
        placed.append((name, index))
    total = sum(wanted.values())
    if total > len(candidates):
        raise UsageError(
            f"--faults: {total} faults need at least {total} busy nodes in jobs "
            f"of two or more; this fleet has {len(candidates)}"
        )
    placed += [(name, candidates.pop()) for name, count in wanted.items() for _ in range(count)]
    out = []
    lo, hi = onset_range
    for name, node in placed:
        onset = fleet.t[0] + rng.uniform(lo, hi) * (fleet.t[-1] - fleet.t[0])
        out.append(F.FAULTS.get(name)(fleet, node, fleet.index_at(onset), rng))
    return out


def _place_fabric(
    fleet: Fleet,
    wanted: dict[str, int],
    rng: np.random.Generator,
    onset_range: tuple[float, float],
    pinned: Sequence[tuple[str, str]],
    taken: set[str],
) -> list[F.FabricInjection]:
    """Each fabric fault on its own switch (or node), where busy nodes would feel it: a leaf
    with three or more nodes talking across the fabric, a spine with two such leaves or more
    (and another spine beside it), a talking node with no node fault of its own."""
    topo = fleet.topology
    talking = F.talking(fleet)
    busy = {fleet.names[i] for i in np.flatnonzero(talking)}
    leaves = [s for s in topo.leaves() if sum(n in busy for n in topo.switches[s].nodes) >= 3]
    spines = [
        s
        for s in topo.switches
        if topo.parent_of(s) is not None
        and s not in topo.leaves()
        and sum(leaf in leaves for leaf in topo.switches[s].switches) >= 2
    ]
    if len([s for s in topo.switches if topo.parent_of(s) is not None]) - len(topo.leaves()) < 2:
        spines = []  # one spine group is the whole fleet: not a component to tell apart
    free = {"leaf": leaves, "spine": spines, "node": sorted(busy - taken)}
    for pool in free.values():
        rng.shuffle(pool)
    placed: list[tuple[str, str]] = []
    for name, at in pinned:
        where = F.FABRIC_PLACE[name]
        if at not in free[where]:
            raise UsageError(f"--faults: {name}@{at}: {at} is not a busy {where} of this trace")
        free[where].remove(at)
        _keep_apart(topo, where, at, free)
        placed.append((name, at))
    for name, count in wanted.items():
        where = F.FABRIC_PLACE[name]
        for _ in range(count):
            if not free[where]:
                raise UsageError(
                    f"--faults: no {where} left for {name} in this fleet (more nodes, "
                    "or fewer fabric faults)"
                )
            at = free[where].pop()
            _keep_apart(topo, where, at, free)
            placed.append((name, at))
    out = []
    lo, hi = onset_range
    for name, at in placed:
        onset = fleet.t[0] + rng.uniform(lo, hi) * (fleet.t[-1] - fleet.t[0])
        out.append(F.FABRIC.get(name)(fleet, at, fleet.index_at(onset), rng))
    return out


def _keep_apart(topo: Any, where: str, at: str, free: dict[str, list[str]]) -> None:
    """Take the switches and nodes under (and above) *at* out of the pools (best effort: the
    faults already drawn keep their places; one fault's nodes should be its own)."""
    under = set(topo.nodes_under(at)) if where != "node" else {at}
    above = set(topo.path(next(iter(under)))) if under else set()
    free["node"][:] = [n for n in free["node"] if n not in under]
    free["leaf"][:] = [
        s for s in free["leaf"] if s not in above and not under & set(topo.switches[s].nodes)
    ]
    free["spine"][:] = [
        s for s in free["spine"] if s not in above and not under & set(topo.nodes_under(s))
    ]


def topology_conf(fleet: Fleet) -> str:
    """The fleet's tree as Slurm's topology.conf (topology/tree) writes it."""
    topo = fleet.topology
    lines = ["# the simulated fleet's network tree (Slurm topology/tree)"]
    for name in sorted(topo.switches, key=lambda s: (len(topo.nodes_under(s)), s)):
        sw = topo.switches[name]
        part = f"Nodes={','.join(sw.nodes)}" if sw.nodes else f"Switches={','.join(sw.switches)}"
        lines.append(f"SwitchName={name} {part}")
    return "\n".join(lines) + "\n"


def simulate(
    out: Path,
    *,
    nodes: int = 64,
    duration: float = 1800.0,
    interval: float = 10.0,
    seed: int = 0,
    faults: str = "all",
    confounders: bool = True,
    start: float = DEFAULT_START,
    onset_range: tuple[float, float] = (0.2, 0.6),
    dry_run: bool = False,
    names: Sequence[str] = (),
    column_files: bool = True,
    leaf_size: int = LEAF,
    segment_minutes: int = 60,
    handoff: bool = False,
) -> Truth:
    """Write a simulated fleet's trace under *out* (store layout) and its truth.json.

    With *dry_run*, plan the fleet and its injections but write nothing. *names* replaces
    the generated node names (node0001...), e.g. to match a real cluster's nodes.
    *column_files*: keep each file's column mirror, as the agent and the probe do.
    *segment_minutes*: how long each file covers, as ``[store] segment_minutes`` says.
    *handoff*: the ranks hand their step records to their node's agent (one file per node
    per segment) instead of each writing its own file.
    """
    if names and len(names) != nodes:
        raise UsageError(f"simulate: {len(names)} names given for {nodes} nodes")
    if nodes < 1 or duration <= 0 or interval <= 0 or duration < 2 * interval:
        raise UsageError("simulate: need --nodes >= 1 and --duration >= 2 x --interval > 0")
    if leaf_size < 1:
        raise UsageError("simulate: need --leaf-size >= 1")
    rng = np.random.default_rng(seed)
    fleet = build(nodes, duration, interval, seed, start)
    fleet.leaf_size = leaf_size
    if names:
        fleet.names = list(names)
    truth = Truth(seed, fleet.names, start, start + duration, interval, leaf_size=leaf_size)
    counted, pinned = split_pinned(faults)
    wanted = parse_faults(counted)
    on_nodes = [(name, node) for name, node in pinned if name not in F.FABRIC]
    truth.faults = _place_faults(
        fleet, {k: v for k, v in wanted.items() if k not in F.FABRIC}, rng, onset_range, on_nodes
    )
    if confounders:
        for _, fn in F.CONFOUNDERS.items():
            truth.confounders.extend(fn(fleet, rng))
    fabric = {k: v for k, v in wanted.items() if k in F.FABRIC}
    on_fabric = [(name, at) for name, at in pinned if name in F.FABRIC]
    if fabric or on_fabric:
        # after the node faults and confounders: a trace without fabric faults is the same
        # trace it always was
        taken = {i.node for i in truth.faults}
        truth.fabric = _place_fabric(fleet, fabric, rng, onset_range, on_fabric, taken)
    if dry_run:
        return truth
    try:
        out.mkdir(parents=True, exist_ok=True)
        truth.records = write_fleet(
            fleet, out, rng, start + duration, column_files, segment_minutes, handoff
        )
        atomic_write(out / "truth.json", json.dumps(truth.to_dict(), indent=1) + "\n")
        atomic_write(out / "topology.conf", topology_conf(fleet))
    except OSError as exc:
        raise StoreError(f"{out}: cannot write the trace: {exc.strerror or exc}") from None
    return truth
