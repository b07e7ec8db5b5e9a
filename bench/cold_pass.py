#!/usr/bin/env python3
"""A cold ``guardctl analyze`` in a store that has been written for an hour and more.

A cold pass reads the segments that can hold the half hour of step records it needs (the
judged windows and the ranks' own history) and, for clocks apart, a quarter of an hour more:
with 10-minute segments, about an hour of records of every kind, for windows that judge a
quarter of an hour of GPU, NIC and host records. It lets go, as it reads, of every record
older than the windows need (``guardctl.analyze.frame.cut``; from closed segments they are
not even read). This measures that pass against the same pass keeping every record it reads
(what ``guardctl analyze`` did before), in the same run, each in a fresh process, in two
states of the same store:

- ``files``: nothing closed (no controller's leader running), every segment read from the
  agents' files and their column mirrors;
- ``closed``: every segment but the newest closed into Parquet, as the leader keeps it.

Both passes must return the same analysis (digests compared). In the second state the
controller's analyzer's first pass is measured too (windows on the minute, as its daemon
judges them), against the same pass reading every record of the closed segments (as it did
before); both must return what a cold pass ending where they end returns (but for the count of
records read, which a pass at a given time counts differently). The store is simulated with
the node agents' layout (ranks hand their steps to the agent, 10-minute segments), or taken
from ``--store DIR`` (made by an earlier run, kept)::

    python bench/cold_pass.py --gpus 10k --minutes 65 --store DIR

Much of a pass's time is the kernel handing it memory it has not touched. On a virtual machine
whose host takes back the memory its guest frees (free page reporting, ballooning), that is
the host backing each page anew, many times slower than on hardware. ``--touch GIB`` has a
process touch and free that much memory just before each pass, so that the pass finds memory
the host still backs, and reports how fast that process touched it (the host's rate when it
is low): run with and without to see both.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze_scale import HANDOFF_ENV, SIZES, _digest, _peak_mib  # noqa: E402

from guardctl.analyze import engine  # noqa: E402
from guardctl.analyze.incremental import Analyzer  # noqa: E402
from guardctl.config import Settings  # noqa: E402
from guardctl.storage import segments  # noqa: E402
from guardctl.storage.arrow import POOL_ENV  # noqa: E402
from guardctl.storage.compact import compact  # noqa: E402

SEGMENT_MINUTES = 10
PASSES = ("every record", "needed records")
FIRST_PASSES = ("first pass, every closed record", "controller's first pass")
GRID_S = 60.0  # the daemon's windows end on the minute (a pass a minute)


def first_pass(mode: str, store: Path) -> dict[str, Any]:
    """The controller's analyzer's first pass in this process, its clock where the newest
    segment ends: its time, peak memory and analysis, checked against a cold pass ending
    where it ends (untimed, after)."""
    settings = Settings()
    if mode == FIRST_PASSES[0]:  # no end known before reading: every closed record read
        setattr(Analyzer, "_first_end", lambda *_: None)  # noqa: B010
    names = [p.name for p in (store / "telemetry").iterdir() if segments.span(p.name)]
    clock = max(segments.span(name)[1] for name in names)  # type: ignore[index]
    t0 = time.perf_counter()
    analyzer = Analyzer(settings, store, grid_s=GRID_S, clock=lambda: clock)
    result = analyzer.analyze()
    seconds = time.perf_counter() - t0
    peak = _peak_mib()
    got = result.to_dict()
    cold = engine.analyze(store, settings, result.window_end).to_dict()
    got["input"].pop("records"), cold["input"].pop("records")
    if got != cold:
        raise SystemExit(f"{mode}: not the cold pass's analysis at {result.window_end}")
    return {
        "seconds": round(seconds, 3),
        "peak_mib": round(peak),
        "records": result.records,
        "kept": sum(n for n, _ in analyzer.kept_records().values()),
        "digest": _digest(got),
    }


def measure(mode: str, store: Path, cache: bool) -> dict[str, Any]:
    """One cold pass in this process: its time, peak memory and analysis."""
    if mode in FIRST_PASSES:
        return first_pass(mode, store)
    settings = Settings()
    settings = dataclasses.replace(
        settings, analyze=dataclasses.replace(settings.analyze, cache=cache)
    )
    cfg = settings.analyze
    t0 = time.perf_counter()
    until = engine.until_now(settings)
    if mode == "every record":  # every record of the segments read kept, as before
        frame = engine.load_recent(store, settings, engine.steps_needed(cfg), until)
        kept = frame.records
        result = engine.analyze_frame(frame, cfg, until=until)
        del frame
    else:
        result = engine.analyze(store, settings, until=until)
    seconds = time.perf_counter() - t0
    peak = _peak_mib()
    if mode != "every record":  # (after the pass: what it kept, read again untimed)
        frame, _ = engine._read_recent(
            store, settings, engine.steps_needed(cfg), until, cfg.window_s
        )
        kept = frame.records
    return {
        "seconds": round(seconds, 3),
        "peak_mib": round(peak),
        "records": result.records,
        "kept": kept,
        "digest": _digest(result.to_dict()),
    }


def touch(gib: float) -> float:
    """Touch *gib* GiB of memory this process had not touched; GiB a second."""
    t0 = time.perf_counter()
    np.ones(int(gib * 2**30) // 8)
    return gib / (time.perf_counter() - t0)


def run_step(
    mode: str, store: Path, cache: bool, pool: str | None = None, gib: float = 0.0
) -> dict[str, Any]:
    env = {**os.environ, **({POOL_ENV: pool} if pool else {})}
    touched = None
    if gib:  # (in a process of its own, which frees the memory as it ends)
        run = [sys.executable, __file__, "--toucher", str(gib)]
        touched = float(subprocess.run(run, check=True, capture_output=True, text=True).stdout)
    out = subprocess.run(
        [sys.executable, __file__, "--measure", mode, str(store), str(int(cache))],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    found: dict[str, Any] = json.loads(out.stdout)
    if touched is not None:
        found["touched_gib_s"] = round(touched, 2)
    print(f"  {mode} ({'closed' if cache else 'files'}): {found}", file=sys.stderr, flush=True)
    return found


def make_store(store: Path, gpus: int, minutes: int) -> None:
    env = {**os.environ, "GUARDCTL_SEGMENT_MINUTES": str(SEGMENT_MINUTES), HANDOFF_ENV: "1"}
    script = Path(__file__).resolve().parent / "analyze_scale.py"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, str(script), "--simulate", str(store), str(gpus), str(minutes)],
        check=True,
        env=env,
    )
    print(f"simulated {minutes} minutes in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def close_all_but_newest(store: Path) -> float:
    """Close every segment that ended before the newest began, as the leader does a few
    minutes after each ends; the seconds it took (0 when a kept store had them closed)."""
    names = [p.name for p in (store / "telemetry").iterdir() if segments.span(p.name)]
    newest = max(segments.span(name)[0] for name in names)  # type: ignore[index]
    t0 = time.perf_counter()
    report = compact(store, newest, grace_s=0.0, workers=os.cpu_count() or 1)
    return time.perf_counter() - t0 if report.closed else 0.0


# Per state of the store: each pass measured, as (label, pass, Arrow's memory pool: None for
# guardctl's own choice). Arrow's default pool is measured against guardctl's choice where
# Parquet files are read.
PLANS: dict[str, list[tuple[str, str, str | None]]] = {
    "files": [(mode, mode, None) for mode in PASSES],
    "closed": [
        *[(mode, mode, None) for mode in PASSES],
        ("needed records, mimalloc", "needed records", "mimalloc"),
        *[(mode, mode, None) for mode in FIRST_PASSES],
    ],
}


def bench(store: Path, gpus: int, minutes: int, rounds: int, gib: float = 0.0) -> dict[str, Any]:
    if not (store / "telemetry").is_dir():
        make_store(store, gpus, minutes)
    result: dict[str, Any] = {"gpus": gpus, "minutes": minutes, "states": {}}
    for state, plan in PLANS.items():
        if state == "closed":
            result["compact_s"] = round(close_all_but_newest(store), 1)
        runs = {
            label: [run_step(mode, store, state == "closed", pool, gib) for _ in range(rounds)]
            for label, mode, pool in plan
        }
        for first in (False, True):  # (a first pass judges windows on the minute)
            digests = {
                r["digest"]
                for label, got in runs.items()
                for r in got
                if (label in FIRST_PASSES) == first
            }
            if len(digests) > 1:
                raise SystemExit(f"{state}: the passes disagree: {sorted(digests)}")
        result["states"][state] = {
            label: {
                "seconds": [r["seconds"] for r in got],
                "peak_mib": [r["peak_mib"] for r in got],
                "records": got[0]["records"],
                "kept": got[0]["kept"],
                **({"touched_gib_s": [r["touched_gib_s"] for r in got]} if gib else {}),
            }
            for label, got in runs.items()
        }
    return result


def table(result: dict[str, Any]) -> str:
    rows = [
        "| store | pass | seconds (x every record read) | peak MiB (x) | records read / kept |",
        "|---|---|---|---|---|",
    ]
    for state, passes in result["states"].items():
        for mode, got in passes.items():
            base = passes[FIRST_PASSES[0] if mode in FIRST_PASSES else "every record"]
            s, m = min(got["seconds"]), min(got["peak_mib"])
            ratio_s, ratio_m = s / min(base["seconds"]), m / min(base["peak_mib"])
            touched = got.get("touched_gib_s")  # (how fast the memory before it was touched)
            rows.append(
                f"| {state} | {mode} | {'-'.join(map(str, got['seconds']))} ({ratio_s:.2f}x) "
                + (
                    f"(memory touched before at {'/'.join(map(str, touched))} GiB/s) "
                    if touched
                    else ""
                )
                + f"| {m} ({ratio_m:.2f}x) | {got['records']:,} / {got['kept']:,} |"
            )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="10k", choices=sorted(SIZES))
    parser.add_argument("--minutes", type=int, default=65, help="how long the store was written")
    parser.add_argument("--rounds", type=int, default=1, help="each pass this many times")
    parser.add_argument("--store", type=Path, help="the store (kept, used again; required)")
    parser.add_argument(
        "--touch", type=float, default=0.0, metavar="GIB", help="memory touched before each pass"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)  # MODE STORE CACHE
    parser.add_argument("--toucher", type=float, help=argparse.SUPPRESS)  # GIB
    args = parser.parse_args()
    if args.measure:
        mode, store, cache = args.measure
        print(json.dumps(measure(mode, Path(store), cache == "1")))
        return 0
    if args.toucher:
        print(touch(args.toucher))
        return 0
    if args.store is None:
        parser.error("--store DIR is required")
    result = bench(args.store, SIZES[args.gpus], args.minutes, args.rounds, args.touch)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
