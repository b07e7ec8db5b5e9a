#!/usr/bin/env python3
"""What listing the store costs as it fills, and what a shorter raw retention saves.

Every reader of the store lists it: ``guardctl analyze`` walks every directory cold
(:func:`guardctl.analyze.load.source_files`, then the files are grouped by segment), and the
controller's analyzer keeps a :class:`~guardctl.analyze.load.Listing` that lists again each
directory whose stamp changed, and groups the files again when the list changed
(``Analyzer.segment_files``). Every node directory changes at each segment boundary, when the
agent creates the new segment's files, so what a node directory holds is listed again every
10 minutes. This measures, for store shapes made side by side in the same run:

- ``14d`` (``--days``): every 10-minute segment of 14 days kept as JSON Lines with its column
  mirror, what a node directory holds today (4,032 entries);
- ``1d``: only the last day's JSON Lines and mirrors (the 13 days before kept as closed
  segments alone: their manifests), what ``[store] raw_retention_hours = 24`` leaves (288);
- ``1d-nocols``: the same without the mirrors of closed segments: only the newest segment
  keeps its mirror (145);
- ``1d-by-segment``: the files of ``1d-nocols`` laid out as the agents write them now, in a
  directory per segment (``telemetry/<segment>/<node>.jsonl``) instead of one per node.

For each shape, in the same process and run:

- the cold walk: ``source_files(root)`` and ``segments.group_files`` (seconds each; the
  directories listed and the entries they held), what ``guardctl store compact`` lists;
- the cold pass: what ``guardctl analyze`` lists to find the segments of its windows
  (``segment_groups`` picking ``segments.recent``: a segment's directory it does not read is
  never listed);
- a segment boundary: the next segment's JSON Lines and mirror created for every node (as
  the agents do), then one ``Analyzer.segment_files(list_again=True)`` (the
  controller's listing and grouping); and the call after it, ``SETTLE_S`` later: a directory
  whose stamp was first seen within the last ``SETTLE_S`` (and is younger than ``OLD_S``) is
  listed again at the next call, so a boundary costs the controller two listings of every
  node directory when its passes come under a minute after the boundary;
- steady: the same call once more with nothing changed (a stat of each directory);
- memory: what the controller's analyzer holds after its first listing and grouping (its
  ``Listing`` and groups; tracemalloc), per node directory.

Seconds are the fastest and median of ``--rounds`` (each round's boundary adds a segment);
the files made at the boundaries are removed at the end, so that a kept store keeps its
shape. ``--idle S`` waits S seconds before each timed call, as passes a minute apart do: a
network filesystem's caches of names and attributes (sshfs: 20 s) have expired by then.
Local "cold" walks find the names in the kernel's caches (the store was just made or just
listed).

``--store DIR`` makes the three stores in DIR (one directory each), or reuses those already
there (serve DIR over the network filesystem, ``tools/netfs.sh up DIR MOUNT``, and run again
with ``--store MOUNT``); without it they are made in a temporary directory under
``/var/tmp`` and removed.

    python bench/store_listing.py [--nodes 200] [--days 14] [--rounds 3] [--store DIR] [--idle S]
    python bench/store_listing.py --quick      # 20 nodes, 2 days, 1 round
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from compact_listing import (  # noqa: E402
    SEGMENT_S,
    counted_listings,
    make_store,
    node_file,
    report,
    store_parser,
)

from guardctl.analyze.incremental import Analyzer  # noqa: E402
from guardctl.analyze.load import Listing, segment_groups, source_files  # noqa: E402
from guardctl.config import Layer, build_settings  # noqa: E402
from guardctl.storage import layout, segments  # noqa: E402

RAW_DAYS = 1  # the shorter raw retention compared against keeping every day
STEPS = ("cold walk", "cold pass", "boundary", "after settling", "steady")
# What a cold pass reads: 3 windows of 5 minutes and the ranks' own history of 3 more.
COLD_SPAN_S = 1800.0


def shapes(days: int) -> dict[str, dict[str, Any]]:
    """Each store shape's name and how make_store makes it."""
    return {
        f"{days}d": {"raw_days": None, "mirrored": None, "by_node": True},
        f"{RAW_DAYS}d": {"raw_days": RAW_DAYS, "mirrored": None, "by_node": True},
        f"{RAW_DAYS}d-nocols": {"raw_days": RAW_DAYS, "mirrored": 1, "by_node": True},
        f"{RAW_DAYS}d-by-segment": {"raw_days": RAW_DAYS, "mirrored": 1, "by_node": False},
    }


def telemetry_dirs(root: Path) -> list[Path]:
    return sorted(p for p in layout.telemetry_dir(root).iterdir() if p.is_dir())


def by_node(root: Path) -> bool:
    """Whether the store's agents' files lie in a directory per node (else per segment)."""
    return segments.span(telemetry_dirs(root)[0].name) is None


def node_names(root: Path) -> list[str]:
    if by_node(root):
        return [p.name for p in telemetry_dirs(root)]
    return sorted(p.stem for p in telemetry_dirs(root)[-1].glob("*.jsonl"))


def newest_segment_end(root: Path) -> float:
    """When the newest segment the store's node files belong to ends."""
    if by_node(root):  # every node's directory holds the same segments
        spans = map(segments.file_span, os.listdir(telemetry_dirs(root)[0]))
    else:
        spans = map(segments.span, os.listdir(layout.telemetry_dir(root)))
    return max(s for s in spans if s is not None)[1]


@contextmanager
def counted() -> Iterator[dict[str, Any]]:
    """Seconds, directories listed and the entries they held, of what runs inside."""
    out: dict[str, Any] = {}
    with counted_listings() as listed:
        started = time.perf_counter()
        yield out
        out["s"] = time.perf_counter() - started
    out["dirs_listed"] = len(listed)
    out["entries_listed"] = sum(len(os.listdir(d)) for d in listed)  # after the clock


class Shape:
    """One store shape, its controller's listing kept from call to call."""

    def __init__(self, name: str, root: Path) -> None:
        self.name, self.root = name, root
        self.by_node = by_node(root)
        self.nodes = node_names(root)
        self.analyzer = Analyzer(build_settings([Layer("bench", {"store": {"root": str(root)}})]))
        self.made: list[Path] = []  # files the boundaries made, removed at the end
        self.listed_at = 0.0  # (monotonic) when the last listing began
        self.times: dict[str, list[float]] = {step: [] for step in STEPS}
        self.counts: dict[str, dict[str, int]] = {}

    def first_listing(self) -> None:
        self.analyzer.segment_files(list_again=True)
        self.listed_at = time.monotonic()

    def settled_listing(self) -> None:
        """List again once SETTLE_S has passed: every directory's listing is trusted then."""
        self.wait_to_settle(0.0)
        self.analyzer.segment_files(list_again=True)

    def wait_to_settle(self, idle_s: float) -> None:
        """Idle *idle_s*, and at least until SETTLE_S has passed since the last listing."""
        left = Listing.SETTLE_S + 0.5 - (time.monotonic() - self.listed_at)
        time.sleep(max(idle_s, left))

    def record(self, step: str, found: dict[str, Any], segments_found: int) -> None:
        self.times[step].append(found["s"])
        self.counts[step] = {
            "dirs_listed": found["dirs_listed"],
            "entries_listed": found["entries_listed"],
            "segments": segments_found,
        }

    def cold_walk(self, idle_s: float) -> None:
        time.sleep(idle_s)
        with counted() as found:
            files = source_files(self.root)
            listed = time.perf_counter()
            groups = segments.group_files(files)
            found["group_s"] = time.perf_counter() - listed
        self.record("cold walk", found, len(groups))
        self.times.setdefault("cold walk: grouping", []).append(found["group_s"])

    def cold_pass(self, idle_s: float) -> None:
        time.sleep(idle_s)
        with counted() as found:
            groups = segment_groups(
                self.root, pick=lambda names: segments.recent(names, COLD_SPAN_S)
            )
        self.record("cold pass", found, len(groups))

    def boundary(self, idle_s: float) -> None:
        """The agents start the next segment, every node's files; the controller lists."""
        start = newest_segment_end(self.root)
        name = segments.segment_name(start, SEGMENT_S // 60)
        for node in self.nodes:
            path = node_file(self.root, node, name, self.by_node)
            path.parent.mkdir(exist_ok=True)
            for suffix in (".jsonl", ".cols"):
                path.with_suffix(suffix).touch(exist_ok=False)
                self.made.append(path.with_suffix(suffix))
        time.sleep(idle_s)
        self.listed_at = time.monotonic()
        groups = self.timed_call("boundary")
        if len(groups.get(name, [])) != len(self.nodes):
            raise SystemExit(
                f"{self.name}: the new segment {name} was not listed: {groups.get(name)}"
            )

    def after_settling(self, idle_s: float) -> None:
        """The controller's next call: each directory listed at the boundary is listed again."""
        self.wait_to_settle(idle_s)
        self.timed_call("after settling")

    def steady(self, idle_s: float) -> None:
        time.sleep(idle_s)
        self.timed_call("steady")
        if self.counts["steady"]["dirs_listed"]:
            raise SystemExit(f"{self.name}: a steady call listed {self.counts['steady']}")

    def timed_call(self, step: str) -> dict[str, list[str]]:
        with counted() as found:
            groups = self.analyzer.segment_files(list_again=True)
        self.record(step, found, len(groups))
        return groups

    def clean_up(self) -> None:
        for path in self.made:
            path.unlink()
            if not self.by_node and not any(path.parent.iterdir()):
                path.parent.rmdir()  # the boundary's segment directory
        self.made.clear()

    def memory(self) -> dict[str, int]:
        """What a fresh controller's analyzer holds after its first listing and grouping
        (bytes): its Listing and its groups."""
        analyzer = Analyzer(self.analyzer.settings)  # (what it holds before: not counted)
        tracemalloc.start()
        try:
            analyzer.segment_files(list_again=True)
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return {"current": current, "peak": peak}

    def result(self) -> dict[str, Any]:
        entries = [len(os.listdir(d)) for d in telemetry_dirs(self.root)]
        if not self.by_node:  # a node's entries: as many in each segment's directory
            entries = [sum(entries) / len(self.nodes)]
        steps = {
            step: {
                "fastest_s": min(times),
                "median_s": statistics.median(times),
                **self.counts.get(step, {}),
            }
            for step, times in self.times.items()
        }
        memory = self.memory()
        return {
            "nodes": len(self.nodes),
            "entries_per_node": statistics.median(entries),
            "steps": steps,
            "memory": memory,
            "memory_per_node": memory["current"] / len(self.nodes),
        }


def make_stores(top: Path, nodes: int, days: int) -> float:
    """The shapes not made yet under *top*; seconds it took."""
    started = time.perf_counter()
    for name, how in shapes(days).items():
        if not (top / name / "telemetry").is_dir():
            make_store(top / name, nodes, days, **how)
    return time.perf_counter() - started


def measure(top: Path, days: int, rounds: int, idle_s: float) -> dict[str, Any]:
    found = [Shape(name, top / name) for name in shapes(days)]
    for shape in found:
        shape.first_listing()
    for shape in found:
        shape.settled_listing()
    try:
        for _ in range(rounds):  # the shapes alternate: each round sees the same conditions
            steps = (Shape.cold_walk, Shape.cold_pass, Shape.boundary, Shape.after_settling)
            for step in (*steps, Shape.steady):
                for shape in found:
                    step(shape, idle_s)
    finally:
        for shape in found:
            shape.clean_up()
    return {shape.name: shape.result() for shape in found}


def with_ratios(result: dict[str, Any]) -> None:
    """Each shape's medians and memory as a fraction of the first (fullest) shape's."""
    shapes_found = result["shapes"]
    base = next(iter(shapes_found.values()))
    for shape in shapes_found.values():
        shape["ratio"] = {
            step: shape["steps"][step]["median_s"] / row["median_s"] if row["median_s"] else 0.0
            for step, row in base["steps"].items()
        }
        shape["ratio"]["memory"] = shape["memory_per_node"] / base["memory_per_node"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from segment_format import filesystem  # beside this script: one reading of /proc/mounts

    temporary = args.store is None
    top = (
        Path(tempfile.mkdtemp(prefix="store-listing-", dir="/var/tmp")) if temporary else args.store
    )
    try:
        made = make_stores(top, args.nodes, args.days)
        measured = measure(top, args.days, args.rounds, args.idle)
    finally:
        if temporary:
            shutil.rmtree(top)
    result = {
        "filesystem": filesystem(top).split(" ", 1)[0],
        "stores_made_s": made,
        "idle_s": args.idle,
        "rounds": args.rounds,
        "loadavg": os.getloadavg(),
        "shapes": measured,
    }
    with_ratios(result)
    return result


def cell(shape: dict[str, Any], step: str) -> str:
    """A step's median (fastest) seconds and its ratio to the fullest shape's."""
    row = shape["steps"][step]
    return f"{row['median_s']:.4f} ({row['fastest_s']:.4f}) x{shape['ratio'][step]:.2f}"


def print_table(result: dict[str, Any]) -> None:
    first = next(iter(result["shapes"].values()))
    print(
        f"{first['nodes']} nodes on {result['filesystem']}, {result['idle_s']:g} s "
        f"idle before each call, median (fastest) of {result['rounds']}, load average "
        f"{' '.join(f'{x:.1f}' for x in result['loadavg'])}"
    )
    print(
        "| shape | entries per node | cold walk s (of which grouping) | cold pass s "
        "| boundary s | after settling s | steady s | memory per node |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, shape in result["shapes"].items():
        grouping = shape["steps"]["cold walk: grouping"]["median_s"]
        print(
            f"| {name} | {shape['entries_per_node']:,.0f} "
            f"| {cell(shape, 'cold walk')} [{grouping:.4f}] | {cell(shape, 'cold pass')} "
            f"| {cell(shape, 'boundary')} "
            f"| {cell(shape, 'after settling')} | {cell(shape, 'steady')} "
            f"| {shape['memory_per_node'] / 1024:.1f} KiB x{shape['ratio']['memory']:.2f} |"
        )
    print("| shape | step | dirs listed | entries listed | segments |")
    print("|---|---|---|---|---|")
    for name, shape in result["shapes"].items():
        for step in STEPS:
            row = shape["steps"][step]
            print(
                f"| {name} | {step} | {row['dirs_listed']:,} | {row['entries_listed']:,} "
                f"| {row['segments']:,} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = store_parser(__doc__, "20 nodes, 2 days, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.days, args.rounds = 20, 2, 1
    if args.days <= RAW_DAYS:
        parser.error(f"--days must be more than {RAW_DAYS}")
    report(run(args), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
