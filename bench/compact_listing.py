#!/usr/bin/env python3
"""The controller leader's compaction over a store of weeks: walking the store, or not.

After each pass the controller's leader closes the store's ended segments
(:func:`guardctl.storage.compact.compact`). It used to walk the store for that (every
``telemetry/<node>/`` directory listed, every name grouped by segment), a second time after
the pass's own analysis had listed it; it now takes the files as the pass's analyzer listed
them (:meth:`Analyzer.segment_files`). This measures one such call both ways, in the same run:

- ``walk`` (the old way, still ``guardctl store compact``'s): ``compact(root, now,
  rechecks=...)``, which lists the store itself;
- ``from the pass``: the same call given the analyzer's listing (made before, untimed: the
  pass made it for its analysis anyway).

Both as a new leader's first call with nothing to go by (every closed segment that may still
grow looked at). Then an hour of the leader's passes a minute apart, looking at those
segments every pass (as it was) and by age (``segments.Rechecks``), and the first pass of a
leader taking over after that hour, going by the last one's looks or with nothing to go by.

The store is synthetic and made fast, in the node agents' layout: a directory per 10-minute
segment of *days* days, each holding *nodes* nodes' files as an empty ``.jsonl`` and its
``.cols`` mirror (what retention keeps at a site), every segment closed (its manifest
written as compaction writes it for empty files). So each call finds nothing to write: what
it costs is finding that out, the steady state of every pass. Both calls' reports must
agree. Figures: seconds (fastest and median of ``--rounds``), directories listed and the
entries they held, the segments looked at, and the load average. ``--idle S`` waits S
seconds before each call, as passes a minute apart do: a network filesystem's caches of
names and attributes (sshfs: 20 s) have expired by then, and what is left of each call is a
round trip per file it looks at.

``--store DIR`` makes the store there, or reuses the one already there (a store made by this
benchmark: serve DIR over the network filesystem, ``tools/netfs.sh up DIR MOUNT``, and run
again with ``--store MOUNT``); without it a temporary one under ``/var/tmp`` is made and
removed.

    python bench/compact_listing.py [--nodes 200] [--days 14] [--rounds 3] [--store DIR] [--idle S]
    python bench/compact_listing.py --quick      # 20 nodes, 2 days
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from guardctl.analyze.incremental import Analyzer  # noqa: E402
from guardctl.config import Layer, build_settings  # noqa: E402
from guardctl.storage import closed, layout, segments  # noqa: E402
from guardctl.storage import store as shared_store  # noqa: E402
from guardctl.storage.compact import CompactReport, compact  # noqa: E402

SEGMENT_S = 600
# The module, not the package's ``load`` function of the same name: its directory listing is
# what both ways go through, counted here.
LOAD: Any = importlib.import_module("guardctl.analyze.load")


def segment_names(days: int, end: float) -> list[str]:
    """Every 10-minute segment of the *days* days ending at *end* (a segment boundary)."""
    first = end - days * 86400
    return [segments.segment_name(t, 10) for t in range(int(first), int(end), SEGMENT_S)]


def make_store(
    root: Path,
    nodes: int,
    days: int,
    *,
    raw_days: int | None = None,
    mirrored: int | None = None,
    by_node: bool = False,
) -> None:
    """Every node's empty files of every segment, and each segment's manifest.

    *raw_days*: only the newest days keep their JSON Lines (the older segments are left as
    closed segments alone, as a shorter raw retention leaves them); *mirrored*: only the
    newest segments keep their column mirrors (None: every one with its JSON Lines);
    *by_node*: a directory per node, as agents before segments' directories wrote
    (``telemetry/<node>/<segment>.jsonl``; else ``telemetry/<segment>/<node>.jsonl``, as
    they write now)."""
    shared_store.init(root)
    end = time.time() // SEGMENT_S * SEGMENT_S
    names = segment_names(days, end)
    raw = names if raw_days is None else segment_names(min(raw_days, days), end)
    with_mirror = set(raw if mirrored is None else raw[len(raw) - mirrored :])
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL
    node_names = [f"node{i:05d}" for i in range(nodes)]
    for node in node_names:
        for name in raw:
            path = node_file(root, node, name, by_node)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, flags, 0o644))
            if name in with_mirror:
                os.close(os.open(path.with_suffix(".cols"), flags, 0o644))
    layout.manifests_dir(root).mkdir(parents=True, exist_ok=True)
    for name in names:
        bounds = segments.span(name)
        assert bounds is not None
        files = {os.fspath(node_file(Path(), node, name, by_node)): (0, 0) for node in node_names}
        manifest = closed.Manifest(name, bounds[0], bounds[1], files=files, kinds={})
        layout.manifest_path(root, name).write_text(json.dumps(manifest.to_dict()))


def node_file(root: Path, node: str, segment: str, by_node: bool = False) -> Path:
    """A node agent's file of *segment*, in either layout."""
    if by_node:
        return layout.telemetry_dir(root) / node / f"{segment}.jsonl"
    return layout.telemetry_dir(root) / segment / f"{node}.jsonl"


def store_now(root: Path) -> float:
    """A moment just after the store's newest segment ended and its grace passed: every
    segment is closed, and the newest within the recheck window, as after a leader's pass."""
    names = [p.stem for p in layout.manifests_dir(root).iterdir()]
    ends = [s[1] for s in map(segments.span, names) if s is not None]
    return max(ends) + segments.GRACE_S + 1.0


@contextmanager
def counted_listings() -> Iterator[list[str]]:
    """The directories listed meanwhile (through the store's one directory lister)."""
    listed: list[str] = []
    real = LOAD._list_dir

    def counting(directory: str) -> tuple[list[str], list[str]] | None:
        listed.append(directory)
        return real(directory)

    LOAD._list_dir = counting
    try:
        yield listed
    finally:
        LOAD._list_dir = real


def one_call(call: Callable[[], CompactReport]) -> tuple[float, CompactReport, list[str]]:
    with counted_listings() as listed:
        started = time.perf_counter()
        report = call()
        seconds = time.perf_counter() - started
    return seconds, report, listed


def measure(root: Path, rounds: int, idle_s: float) -> dict[str, Any]:
    now = store_now(root)
    settings = build_settings([Layer("bench", {"store": {"root": str(root)}})])
    analyzer = Analyzer(settings, clock=lambda: now)  # the store's time, made or reused
    groups = analyzer.segment_files(list_again=True)  # the pass's listing: made anyway
    ways: dict[str, Callable[[], CompactReport]] = {
        "walk": lambda: compact(root, now, budget_s=60.0, rechecks=NewLeader()),
        "from the pass": lambda: compact(
            root, now, budget_s=60.0, rechecks=NewLeader(), groups=groups
        ),
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    reports: dict[str, dict[str, Any]] = {}
    listed: dict[str, list[str]] = {}
    for _ in range(rounds):
        for way, call in ways.items():  # alternated: both see the same caches
            time.sleep(idle_s)
            seconds, report, dirs = one_call(call)
            times[way].append(seconds)
            reports[way], listed[way] = report.to_dict(), dirs
    # The pass's listing leaves out closed segments that neither a pass nor the leader's
    # second look needs (older than segments.LATE_S): both ways must close, leave open and
    # defer the same segments, and "current" counts only those each looked at.
    agree = ("closed", "open", "deferred", "records")
    if any(reports["walk"][key] != reports["from the pass"][key] for key in agree):
        raise SystemExit(f"the two ways disagree: {reports}")
    nodes = max(map(len, groups.values()), default=0)  # (a file per node and segment)
    out: dict[str, Any] = {"nodes": nodes, "ways": {}, "report": reports["walk"]}
    for way in ways:
        entries = sum(len(os.listdir(d)) for d in listed[way])  # (after the clock: uncounted)
        out["ways"][way] = {
            "fastest_s": min(times[way]),
            "median_s": statistics.median(times[way]),
            "dirs_listed": len(listed[way]),
            "entries_listed": entries,
        }
    out["passes"] = leader_passes(root, groups, now, PASSES)
    out["taking_over"] = taking_over(root, groups, now + 60.0 * PASSES)
    return out


PASSES = 60  # an hour of the leader's passes, a minute apart


class EveryPass(segments.Rechecks):
    """The leader as it was: every closed segment that may still grow looked at each pass."""

    def due(self, name: str, end: float, now: float) -> bool:
        return now < end + self.window_s


class NewLeader(segments.Rechecks):
    """A leader with no last look to go by (a manifest's time ahead of its clock, or the
    leader as it was): its first call looks at every closed segment that may still grow."""

    def adopt(self, name: str, end: float, looked_at: float | None, now: float) -> None:
        return None


def closed_by_a_leader(root: Path) -> None:
    """Give each manifest the time a leader passing every minute closed its segment: just
    after its grace (what a leader taking over finds)."""
    for path in layout.manifests_dir(root).iterdir():
        bounds = segments.span(path.stem)
        if bounds is not None:
            os.utime(path, (bounds[1] + segments.GRACE_S, bounds[1] + segments.GRACE_S))


def leader_passes(
    root: Path, groups: dict[str, list[str]], now: float, count: int
) -> dict[str, dict[str, float]]:
    """*count* passes a minute apart from *now*, one leader each way: the closed segments
    looked at again (a stat of each of their files: one per node here; the first pass's
    apart), and the seconds it took. The store does not change meanwhile: every way finds
    every segment as it was closed. Each way starts from the segments as a leader closed
    them, just after their grace."""
    per_segment = max(map(len, groups.values()), default=0)
    out = {}
    for way, rechecks in (("every pass", EveryPass()), ("by age", segments.Rechecks())):
        closed_by_a_leader(root)
        looked, first, started = 0, 0, time.perf_counter()
        for k in range(count):
            report = compact(root, now + 60.0 * k, budget_s=60.0, rechecks=rechecks, groups=groups)
            looked += report.looked
            if k == 0:
                first = report.looked
        out[way] = {
            "seconds": time.perf_counter() - started,
            "segments_looked": looked,
            "first_pass_looked": first,
            "files_looked": looked * per_segment,
        }
    return out


def taking_over(root: Path, groups: dict[str, list[str]], at: float) -> dict[str, int]:
    """The segments a new leader's first pass at *at* looks at, where the last leader's looks
    (by age, :func:`leader_passes`) are on the manifests: going by them, and with nothing to
    go by (as a new leader did before it could)."""
    ways = (
        ("going by the last leader's looks", segments.Rechecks()),
        ("nothing to go by", NewLeader()),
    )
    return {
        way: compact(root, at, budget_s=60.0, rechecks=rechecks, groups=groups).looked
        for way, rechecks in ways
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from segment_format import filesystem  # beside this script: one reading of /proc/mounts

    made, root = 0.0, args.store
    temporary = root is None
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="compact-listing-", dir="/var/tmp")) / "store"
    try:
        if not (root / "telemetry").is_dir():
            started = time.perf_counter()
            make_store(root, args.nodes, args.days)
            made = time.perf_counter() - started
        result = measure(root, args.rounds, args.idle)
    finally:
        if temporary:
            shutil.rmtree(root.parent)
    return {
        "filesystem": filesystem(root.parent if temporary else root).split(" ", 1)[0],
        "store_made_s": made,
        "idle_s": args.idle,
        "loadavg": os.getloadavg(),
        **result,
    }


def print_table(result: dict[str, Any]) -> None:
    walk = result["ways"]["walk"]
    report = result["report"]
    print(
        f"{result['nodes']} nodes on {result['filesystem']}: {report['current']} closed "
        f"segments, {result['idle_s']:g} s idle before each call, load average "
        f"{' '.join(f'{x:.1f}' for x in result['loadavg'])}"
    )
    print("| leader's compaction | fastest s | median s | dirs listed | entries listed |")
    print("|---|---|---|---|---|")
    for way, row in result["ways"].items():
        ratio = walk["median_s"] / row["median_s"] if row["median_s"] else float("inf")
        print(
            f"| {way} | {row['fastest_s']:.3f} | {row['median_s']:.3f} ({ratio:.0f}x) | "
            f"{row['dirs_listed']:,} | {row['entries_listed']:,} |"
        )
    print()
    print(
        f"| the leader's {PASSES} passes a minute apart | s | segments looked at again "
        "(the first pass) | files stat'ed (a pass) |"
    )
    print("|---|---|---|---|")
    for way, row in result["passes"].items():
        print(
            f"| {way} | {row['seconds']:.2f} | {row['segments_looked']:,} "
            f"({row['first_pass_looked']}) "
            f"| {row['files_looked']:,} ({row['files_looked'] / PASSES:,.0f}) |"
        )
    print()
    print("A new leader's first pass after that hour, segments looked at:", end="")
    print("".join(f" {way}: {n};" for way, n in result["taking_over"].items()).rstrip(";"))


def store_parser(doc: str, quick: str) -> argparse.ArgumentParser:
    """The options of the benchmarks over a synthetic store of weeks (this one's and
    bench/store_listing.py's); *quick*: what ``--quick`` runs."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", type=Path, default=None)
    parser.add_argument("--idle", type=float, default=0.0, help="seconds idle before each call")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", action="store_true")
    return parser


def report(result: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        table(result)


def main(argv: list[str] | None = None) -> int:
    args = store_parser(__doc__, "20 nodes, 2 days").parse_args(argv)
    if args.quick:
        args.nodes, args.days = 20, 2
    report(run(args), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
