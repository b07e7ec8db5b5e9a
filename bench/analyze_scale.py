#!/usr/bin/env python3
"""Scale benchmark: one analysis pass over 5 minutes of telemetry at a 10 s interval.

For fleets of 1k, 10k, 30k and 100k GPUs it writes a simulated trace (JSON Lines plus
the column mirrors the agent and the probe keep beside them), then measures,
each in a fresh process (so peak memory is that step's own):

- ``read``: merely reading every byte of the JSON Lines files (the baseline);
- ``read cols``: merely reading every byte of the column mirrors;
- ``cold``: ``guardctl.analyze.analyze`` on the store with an empty cache
  (reads the column mirrors);
- ``warm``: the same pass again;
- ``cold JSON``: a cold pass that ignores the mirrors and parses the JSON Lines
  (``analyze.column_files = false``: a store written by foreign writers), and
  ``warm JSON``, the same again from the analyzer's own cache of parsed columns;
- ``incremental``: in one process, a :class:`guardctl.analyze.incremental.Analyzer`
  judges the five minutes (its first pass, a cold one), then the writers append
  a sixth minute (to the files and their mirrors) and it judges again: the pass
  a minute later, which reads only that minute;
- after that sixth minute: ``+1 min JSON``, the JSON pass again (it parses only
  the new tails), and ``+1 min``, a cold pass from the mirrors (which it reads
  whole every time: six minutes now). The incremental pass must return exactly
  what this cold pass returns (checked: a digest of both analyses).

Times are wall-clock seconds (with ``--rounds N``: the fastest and slowest of N
rounds, for a shared machine); memory is the peak RSS of the process and its
workers. Ratios are against ``read`` measured in the same run. The files sit
in the page cache for every step (the simulator just wrote them), so ``read``
is memory bandwidth, not disk.

    python bench/analyze_scale.py            # 1k, 10k, 30k, 100k GPUs
    python bench/analyze_scale.py --quick    # 1k and 10k GPUs (CI)
    python bench/analyze_scale.py --sizes 10k --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pickle
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = {"1k": 1_000, "10k": 10_000, "30k": 30_000, "100k": 100_000}


def measure(mode: str, store: str) -> dict[str, Any]:
    """Run one step in this process and report its time and peak memory."""
    from guardctl.analyze import analyze
    from guardctl.analyze.load import source_files
    from guardctl.config import Settings
    from guardctl.telemetry.mirror import mirror_path

    root = Path(store)
    if mode == "incremental":
        return _incremental(root)
    if mode in ("cold", "cold_json", "inc"):  # no cache (not timed: it is not the pass's work)
        shutil.rmtree(root / "cache", ignore_errors=True)
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if mode in ("read", "read_cols"):
        total = 0
        for f in source_files(root):
            try:
                with open(f if mode == "read" else mirror_path(f), "rb") as fh:
                    total += len(fh.read())
            except FileNotFoundError:  # a file without a mirror
                continue
        extra["bytes"] = total
    else:
        settings = Settings()
        if mode.endswith("json"):
            no_cols = dataclasses.replace(settings.analyze, column_files=False)
            settings = dataclasses.replace(settings, analyze=no_cols)
        result = analyze(root, settings)
        extra["nodes"] = len(result.nodes)
        extra["records"] = result.records
        extra["digest"] = _digest(result.to_dict())
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_mib": _peak_mib(), **extra}


def _digest(analysis: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(analysis, sort_keys=True).encode()).hexdigest()


def _incremental(root: Path) -> dict[str, Any]:
    """The incremental analyzer's first pass, then the writers' sixth minute, then its next pass."""
    from guardctl.analyze.incremental import Analyzer
    from guardctl.config import Settings

    shutil.rmtree(root / "cache", ignore_errors=True)
    analyzer = Analyzer(Settings(), root)
    t0 = time.perf_counter()
    analyzer.analyze()
    first = time.perf_counter() - t0
    with open(root.parent / f"{root.name}.held", "rb") as fh:
        held, mirrors = pickle.load(fh)
    _append(held, mirrors)  # the writers' work, not timed
    del held, mirrors
    os.sync()
    t0 = time.perf_counter()
    result = analyzer.analyze()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "first_s": first, "peak_mib": _peak_mib(),
            "digest": _digest(result.to_dict()), "restarts": analyzer.restarts}  # fmt: skip


def _peak_mib() -> float:
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent.
    status = Path("/proc/self/status").read_text()
    own = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # forked workers
    return max(own, kids) / 1024


def run_step(mode: str, store: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--measure", mode, str(store)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def hold_back(store: Path, parts: int) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Cut the last 1/*parts* of every file's lines off (returned, to append later).

    Each cut file's column mirror is rebuilt for what is left (as its writer
    would have kept it a minute earlier); those mirrors are returned too, to
    restore between rounds.
    """
    from guardctl.telemetry.mirror import Mirror, mirror_path

    held, mirrors = {}, {}
    mirror = Mirror(fsync=False)
    for dirpath, _dirs, names in os.walk(store):
        for name in names:
            if name.endswith(".jsonl"):
                path = os.path.join(dirpath, name)
                with open(path, "rb") as fh:
                    lines = fh.read().splitlines(keepends=True)
                cut = len(lines) * (parts - 1) // parts
                with open(path, "wb") as fh:
                    fh.write(b"".join(lines[:cut]))
                held[path] = b"".join(lines[cut:])
                cols = mirror_path(path)
                if os.path.exists(cols):
                    os.unlink(cols)
                    mirror.sync(path)
                    mirror.forget(path)
                    with open(cols, "rb") as fh:
                        mirrors[cols] = fh.read()
    return held, mirrors


def _append(held: dict[str, bytes], mirrors: dict[str, bytes]) -> None:
    from guardctl.telemetry.mirror import Mirror, mirror_path

    mirror = Mirror(fsync=False)
    for name, data in held.items():  # the writers append the sixth minute
        with open(name, "ab") as fh:
            start = fh.tell()
            fh.write(data)
        if mirror_path(name) in mirrors:
            mirror.append(name, start, data)
            mirror.forget(name)


def _cut(held: dict[str, bytes], mirrors: dict[str, bytes]) -> None:
    for name, data in held.items():  # back to five minutes, for the next round
        os.truncate(name, os.path.getsize(name) - len(data))
    for name, data in mirrors.items():
        with open(name, "wb") as fh:
            fh.write(data)


def bench(label: str, gpus: int, workdir: Path, rounds: int = 1) -> dict[str, object]:
    from guardctl.simulate import simulate

    store = workdir / label
    load_before = os.getloadavg()[0]  # a shared machine: say how busy it was
    t0 = time.perf_counter()
    simulate(store, nodes=gpus // 8, duration=360.0, interval=10.0, seed=1, faults="none")
    sim_s = time.perf_counter() - t0
    held, mirrors = hold_back(store, 6)  # the store as it was a minute ago: 5 minutes
    os.sync()  # the simulator's gigabytes written back first, not during the timed passes
    modes = ("read", "read_cols", "cold", "warm", "cold_json", "warm_json")
    steps: dict[str, list[dict[str, Any]]] = {
        m: [] for m in (*modes, "incremental", "inc_json", "inc")
    }
    with open(workdir / f"{label}.held", "wb") as fh:
        pickle.dump((held, dict.fromkeys(mirrors, b"")), fh)  # only the names are needed
    for r in range(rounds):  # the machine may be shared: each round measures every step
        if r:
            _cut(held, mirrors)
            os.sync()
        for mode in modes:
            steps[mode].append(run_step(mode, store))
        steps["incremental"].append(run_step("incremental", store))  # appends the minute
        # A minute later: from the cache the JSON passes left (parsing only the new tails),
        # then from the mirrors (which never need the cache: read whole each pass).
        steps["inc_json"].append(run_step("inc_json", store))
        steps["inc"].append(run_step("inc", store))
    shutil.rmtree(store, ignore_errors=True)
    for inc, cold in zip(steps["incremental"], steps["inc"], strict=True):
        if inc["digest"] != cold["digest"]:
            raise SystemExit(f"{label}: the incremental pass differs from the cold pass")

    def best(mode: str, key: str = "seconds") -> float:
        return min(s[key] for s in steps[mode])

    def worst(mode: str, key: str = "seconds") -> float:
        return max(s[key] for s in steps[mode])

    return {
        "fleet": label,
        "gpus": gpus,
        "rounds": rounds,
        "records": steps["cold"][0]["records"],
        "mib": steps["read"][0]["bytes"] / 2**20,
        "simulate_s": sim_s,
        **{f"{m}_s": best(m) for m in steps},
        **{f"{m}_s_max": worst(m) for m in steps},
        **{f"{m}_mib": worst(m, "peak_mib") for m in steps},
        "incremental_first_s": min(s["first_s"] for s in steps["incremental"]),
        "incremental_x": best("incremental") / best("inc"),
        "cold_x": best("cold") / best("read"),
        "warm_x": best("warm") / best("read"),
        "cold_json_x": best("cold_json") / best("read"),
        "warm_json_x": best("warm_json") / best("read"),
        "cols_mib": steps["read_cols"][0]["bytes"] / 2**20,
        "load_1min": (load_before, os.getloadavg()[0]),
    }


def _range(r: dict[str, Any], mode: str) -> str:
    low, high = r[f"{mode}_s"], r[f"{mode}_s_max"]
    return f"{low:.2f}" if r["rounds"] == 1 else f"{low:.2f}-{high:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fleet | records | JSON MiB / cols MiB | read s / read cols s | cold s (x read) "
        "| warm s | +1 min s | cold JSON s (x read) | warm JSON s | +1 min JSON s "
        "| peak MiB cold / warm / +1 min / cold JSON "
        "| incremental: first s / +1 min s (x cold +1 min) / peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fleet']} GPUs | {r['records']:,} | {r['mib']:.0f} / {r['cols_mib']:.0f} "
            f"| {_range(r, 'read')} / {_range(r, 'read_cols')} "
            f"| {_range(r, 'cold')} ({r['cold_x']:.1f}x) | {_range(r, 'warm')} "
            f"| {_range(r, 'inc')} "
            f"| {_range(r, 'cold_json')} ({r['cold_json_x']:.1f}x) | {_range(r, 'warm_json')} "
            f"| {_range(r, 'inc_json')} "
            f"| {r['cold_mib']:.0f} / {r['warm_mib']:.0f} / {r['inc_mib']:.0f} "
            f"/ {r['cold_json_mib']:.0f} "
            f"| {r['incremental_first_s']:.2f} / {_range(r, 'incremental')} "
            f"({r['incremental_x']:.2f}x) / {r['incremental_mib']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only 1k and 10k GPUs")
    parser.add_argument("--sizes", default=None, help="comma list of 1k,10k,30k,100k")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure every step this many times (min-max)"
    )
    parser.add_argument("--measure", nargs=2, metavar=("MODE", "STORE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0
    sizes = args.sizes.split(",") if args.sizes else (["1k", "10k"] if args.quick else list(SIZES))
    rows = []
    with tempfile.TemporaryDirectory(prefix="guardctl-scale-") as tmp:
        for label in sizes:
            rows.append(bench(label, SIZES[label], Path(tmp), args.rounds))
            print(f"{label}: {json.dumps(rows[-1])}", file=sys.stderr)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
