"""Simulated fleets: schema-v1 traces with labelled faults and benign confounders, and the truth.

``simulate(out, ...)`` builds a fleet (:mod:`.fleet`), injects faults and
confounders (:mod:`.faults`), writes the records in the store layout
(:mod:`.writer`) so that ``guardctl analyze --input OUT`` reads them, and writes
``OUT/truth.json``: every fault's node, kind and onset, and every confounder.
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
from guardctl.simulate.fleet import build
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
        if name != "all":
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
) -> Truth:
    """Write a simulated fleet's trace under *out* (store layout) and its truth.json.

    With *dry_run*, plan the fleet and its injections but write nothing. *names* replaces
    the generated node names (node0001...), e.g. to match a real cluster's nodes.
    *column_files*: keep each file's column mirror, as the agent and the probe do.
    """
    if names and len(names) != nodes:
        raise UsageError(f"simulate: {len(names)} names given for {nodes} nodes")
    if nodes < 1 or duration <= 0 or interval <= 0 or duration < 2 * interval:
        raise UsageError("simulate: need --nodes >= 1 and --duration >= 2 x --interval > 0")
    rng = np.random.default_rng(seed)
    fleet = build(nodes, duration, interval, seed, start)
    if names:
        fleet.names = list(names)
    truth = Truth(seed, fleet.names, start, start + duration, interval)
    counted, pinned = split_pinned(faults)
    truth.faults = _place_faults(fleet, parse_faults(counted), rng, onset_range, pinned)
    if confounders:
        for _, fn in F.CONFOUNDERS.items():
            truth.confounders.extend(fn(fleet, rng))
    if dry_run:
        return truth
    try:
        out.mkdir(parents=True, exist_ok=True)
        truth.records = write_fleet(fleet, out, rng, start + duration, column_files)
        atomic_write(out / "truth.json", json.dumps(truth.to_dict(), indent=1) + "\n")
    except OSError as exc:
        raise StoreError(f"{out}: cannot write the trace: {exc.strerror or exc}") from None
    return truth
