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

``--steady`` measures the mitigation controller's steady state instead: the
trace is 21 minutes long, so that the three 5-minute windows a pass judges are
full, as on a fleet that has been running (the five-minute store above leaves
two of them nearly empty); the analyzer's first pass is over the first 18
minutes, then the writers append a minute at a time, as a long-lived agent
appends its batches to a file and its mirror, and the analyzer passes after
each (the last of the three is reported: its read buffer and listing are
carried over, as from then on); a cold pass over the 21 minutes is the baseline.
Only reading the mirrors, the cold pass and the incremental passes are measured.
``--minutes M --passes P`` make the trace longer and pass over
more of it: a long run shows what a pass costs once every kind of record is
kept for as long as a pass needs (step records: the ranks' own history too,
35 minutes by default) and whether some passes cost more than the others.

Times are wall-clock seconds (with ``--rounds N``: the fastest and slowest of N
rounds, for a shared machine); memory is the peak RSS of the process and its
workers (the held-back minutes sit in the benchmark's own process, which appends
them as the writers would, not in the analyzer's); the incremental analyzer's
adds the most memory its kept records' rings held unmapped after a pass (pages
let go, kept for the next records: not in the resident size). Ratios are against ``read``
measured in the same run. The files sit in the page cache for every step (the
simulator just wrote them), so ``read`` is memory bandwidth, not disk.

    python bench/analyze_scale.py            # 1k, 10k, 30k, 100k GPUs
    python bench/analyze_scale.py --quick    # 1k and 10k GPUs (CI)
    python bench/analyze_scale.py --sizes 10k --rounds 3
    python bench/analyze_scale.py --steady --sizes 1k,10k,30k
    python bench/analyze_scale.py --steady --sizes 10k --minutes 60 --passes 30
    python bench/analyze_scale.py --steady --sizes 10k --segment-minutes 10 --handoff

``--handoff`` writes the store as where ranks hand their steps to the node agent (one file
per node and segment, ``guardctl simulate --handoff``) instead of a file per rank; a steady
pass reports how many files' new rows it read (``mirror_files``) and how many of them it
opened (``files_opened``: not kept open from the pass before), with this process's
open-files limit raised as the controller's unit raises it where it may.

``--variants`` (with ``--steady``) passes over the same store again per variant, cut back
between them: the kept records without their rings (plain memory twice as long, as where a
ring cannot be made), without packing (every column as the frame has it), and without
either; each must match the cold pass.

    python bench/analyze_scale.py --steady --sizes 10k,30k --segment-minutes 10 --variants
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SIZES = {"1k": 1_000, "10k": 10_000, "30k": 30_000, "100k": 100_000}


HANDOFF_ENV = "GUARDCTL_BENCH_HANDOFF"  # --handoff, for the simulating child


def _handoff() -> bool:
    return bool(os.environ.get(HANDOFF_ENV))


# --variants: what of the kept records' machinery each incremental run leaves out.
VARIANTS = {
    "current": (),
    "no-ring": ("ring",),
    "no-packing": ("packing",),
    "neither": ("ring", "packing"),
}


def measure(mode: str, store: str, at: float | None = None) -> dict[str, Any]:
    """Run one step in this process and report its time and peak memory (*at*: the end of
    the newest window a cold pass judges; default: its newest record)."""
    from guardctl.analyze import analyze
    from guardctl.analyze.load import source_files
    from guardctl.config import Settings
    from guardctl.telemetry.mirror import mirror_path

    root = Path(store)
    step, _, variant = mode.partition(":")
    if step in ("incremental", "steady"):
        return _incremental(
            root, GRID_S if step == "steady" else 0.0, VARIANTS[variant or "current"]
        )
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
        result = analyze(root, settings, at)
        extra["nodes"] = len(result.nodes)
        extra["records"] = result.records
        extra["digest"] = _digest(result.to_dict())
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_mib": _peak_mib(), **extra}


def _digest(analysis: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(analysis, sort_keys=True).encode()).hexdigest()


# The steady state's passes judge windows ending on the minute, as the controller's daemon
# does with a pass a minute ([control] align).
GRID_S = 60.0


def _incremental(root: Path, grid_s: float, without: Sequence[str] = ()) -> dict[str, Any]:
    """The incremental analyzer's first pass, then per held-back minute: the writers append
    it and the analyzer passes again (one pass a minute). The last pass is the one reported.
    *without*: the kept records' machinery left out ("ring", "packing": see VARIANTS)."""
    from guardctl.analyze import incremental
    from guardctl.analyze.incremental import Analyzer
    from guardctl.analyze.packing import Packing
    from guardctl.config import Settings

    if "ring" in without:  # as where memfd_create is refused: plain memory twice as long

        def no_ring(size: int) -> Any:
            raise OSError("no ring (bench variant)")

        setattr(incremental, "Ring", no_ring)  # noqa: B010
    if "packing" in without:  # every kept column as the frame has it
        setattr(incremental, "choose", lambda values: Packing.plain(values.dtype))  # noqa: B010
    shutil.rmtree(root / "cache", ignore_errors=True)
    limit = _open_files_limit()
    analyzer = Analyzer(Settings(), root, grid_s=grid_s)
    t0 = time.perf_counter()
    analyzer.analyze()
    first = time.perf_counter() - t0
    passes: list[float] = []
    kept: list[int] = []
    mirrored: list[int] = []
    opened: list[int] = []
    unmapped = 0
    peaks: list[float] = []  # per pass, its own peak resident size (MiB), where it can be told
    first_peak = _peak_mib()  # (before a pass's peak is started over)
    cpu: list[float] = []  # per pass: this process's processor time
    while _next_minute():  # the writers append it (in the parent: not timed, not our memory)
        c0 = _cpu_s()
        # (the first pass reads whole hours: each later one's peak is measured apart)
        apart = _reset_peak()
        t0 = time.perf_counter()
        result = _profiled(analyzer.analyze, len(passes))
        passes.append(time.perf_counter() - t0)
        peaks.append(_status_kib("VmHWM") / 1024 if apart else math.nan)
        cpu.append(_cpu_s() - c0)
        kept.append(analyzer.read["tables_kept"])
        mirrored.append(analyzer.read["mirror_files"])
        opened.append(analyzer.read["files_opened"])
        unmapped = max(unmapped, analyzer.held_bytes() - _status_kib("RssShmem") * 1024)
    # The kept records' rings hold pages let go for the next pass's records without mapping
    # them: not in the resident size, so added to its peak (an upper bound).
    extra = unmapped / 2**20
    passes_peak = max((p for p in peaks if not math.isnan(p)), default=math.nan)
    return {
        "seconds": passes[-1],
        "passes_s": passes,
        "first_s": first,
        "passes_cpu_s": cpu,
        "peak_mib": max(first_peak, _peak_mib(), passes_peak) + extra,
        "passes_peak_mib": passes_peak + extra,
        "passes_mib": peaks,
        "unmapped_mib": unmapped / 2**20,
        "digest": _digest(result.to_dict()),
        "restarts": analyzer.restarts,
        "tables_kept": kept,
        "mirror_files": mirrored,  # files whose new rows each pass read
        "files_opened": opened,  # of those, the files each pass opened (not kept open)
        "open_files_limit": limit,
        "kept": analyzer.kept_records(),
        "end": result.window_end,
    }


def _open_files_limit() -> int:
    """This process's soft limit on open files, raised as the controller's unit raises it
    (LimitNOFILE, hard limit too) where it may (as root), else as the daemon raises itself
    within the hard limit: its analyzer keeps mirrors open within a quarter of it."""
    from guardctl.limits import CONTROLLER_OPEN_FILES, raise_open_files_limit

    want = CONTROLLER_OPEN_FILES
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < want:
        with contextlib.suppress(OSError, ValueError):  # (not root: the hard limit stands)
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    return raise_open_files_limit(want)


def _profiled(analyze: Any, n: int) -> Any:
    """*analyze*(), under cProfile when ``--profile DIR`` asked for it (its statistics go to
    DIR/pass-N.prof: ``python -m pstats``); the pass's time then includes the profiler's."""
    where = os.environ.get("GUARDCTL_BENCH_PROFILE")
    if not where:
        return analyze()
    import cProfile

    with cProfile.Profile() as prof:
        result = analyze()
    prof.dump_stats(os.path.join(where, f"pass-{n + 1}.prof"))
    return result


def _next_minute() -> bool:
    """Ask the benchmark's parent (the writers) for the next held-back minute: True once it
    is appended, False when none is left."""
    print("next", flush=True)
    return sys.stdin.readline().strip() == "1"


def _peak_mib() -> float:
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent.
    own = _status_kib("VmHWM")
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # forked workers
    return max(own, kids) / 1024


def _reset_peak() -> bool:
    """Start this process's peak resident size (VmHWM) over from its present size (Linux 4.0
    and later: ``clear_refs`` 5); False where that cannot be done."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _status_kib(field: str, pid: str = "self") -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(field + r":\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def _cpu_s() -> float:
    """This process's processor time so far, user and system. On a shared virtual machine a
    pass's wall time moves by a fifth from run to run; its processor time says whether the
    work itself changed."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_step(
    mode: str, store: Path, at: float | None = None, held: Sequence[Minute] = ()
) -> dict[str, Any]:
    """Run one step in a fresh process; the incremental steps ask for the *held* minutes one
    at a time, and this process appends each (as the agents would: their bytes are not the
    analyzer's, nor is their memory)."""
    with subprocess.Popen(
        [sys.executable, __file__, "--measure", mode, str(store), *([str(at)] if at else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        minutes = iter(held)
        for line in child.stdout:
            if line.strip() != "next":
                break
            minute = next(minutes, None)
            if minute is not None:
                _append(minute)
                os.sync()
            child.stdin.write("1\n" if minute is not None else "0\n")
            child.stdin.flush()
        else:
            line = ""
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args)
    print(f"  {mode}: {line.strip()}", file=sys.stderr, flush=True)  # (kept if a later one fails)
    return json.loads(line)


# One held-back minute: per JSON Lines file, its lines and the rows its writer appended to
# the column mirror for them (None: a file without a mirror).
Minute = dict[str, tuple[bytes, bytes | None]]


_TS = re.compile(rb'"ts":(-?[0-9.eE+-]+)')


def _times(lines: list[bytes]) -> list[float]:
    return [float(m.group(1)) if (m := _TS.search(line)) else 0.0 for line in lines]


def hold_back(store: Path, passes: int = 1) -> tuple[list[Minute], dict[str, bytes]]:
    """Cut the last *passes* minutes of records off every file (returned, oldest first).

    A minute is one of the trace's last *passes* minutes by the records' own times (the
    simulator does not write a file's records in time order; an agent appends each
    minute's as it samples them). Each cut file's column mirror is rebuilt for what is
    left (as its writer would have kept it *passes* minutes earlier), then one writer
    appends the held-back minutes to it, one batch each, as a long-lived agent does: the
    rows it appends are kept with each minute, so that appending them later gives the
    mirror that writer would have written. The cut mirrors are returned too, to restore
    between rounds.
    """
    from guardctl.telemetry.mirror import Mirror, mirror_path

    names = [os.path.join(d, n) for d, _, ns in os.walk(store) for n in ns if n.endswith(".jsonl")]
    newest = -math.inf
    for path in names:
        with open(path, "rb") as fh:
            newest = max(newest, *_times(fh.read().splitlines()))
    cuts = [newest - 60.0 * back for back in range(passes, 0, -1)]  # oldest minute first
    held: list[Minute] = [{} for _ in range(passes)]
    mirrors = {}
    for path in names:
        with open(path, "rb") as fh:
            lines = fh.read().splitlines(keepends=True)
        minute = [bisect.bisect_left(cuts, ts) for ts in _times(lines)]  # 0: kept
        kept = b"".join(line for line, m in zip(lines, minute, strict=True) if not m)
        chunks = [
            b"".join(line for line, m in zip(lines, minute, strict=True) if m == k)
            for k in range(1, passes + 1)
        ]
        with open(path, "wb") as fh:
            fh.write(kept)
        cols = mirror_path(path)
        if not os.path.exists(cols):
            for k, data in enumerate(chunks):
                held[k][path] = (data, None)
            continue
        os.unlink(cols)
        mirror = Mirror(fsync=False)
        mirror.sync(path)
        mirrors[cols] = Path(cols).read_bytes()
        start = len(kept)
        for k, data in enumerate(chunks):
            before = os.path.getsize(cols)
            with open(path, "ab") as fh:
                fh.write(data)
            mirror.append(path, start, data)
            start += len(data)
            with open(cols, "rb") as fh:
                fh.seek(before)
                held[k][path] = (data, fh.read())
        mirror.forget(path)
        os.truncate(path, len(kept))
        os.truncate(cols, len(mirrors[cols]))
    return held, mirrors


def _append(minute: Minute) -> None:
    from guardctl.telemetry.mirror import mirror_path

    for name, (data, rows) in minute.items():  # the writers append one minute
        with open(name, "ab") as fh:
            fh.write(data)
        if rows is not None:
            with open(mirror_path(name), "ab") as fh:
                fh.write(rows)


def _cut(held: list[Minute], mirrors: dict[str, bytes]) -> None:
    for minute in held:  # back to the store before the held-back minutes, for the next round
        for name, (data, _) in minute.items():
            os.truncate(name, os.path.getsize(name) - len(data))
    for name, data in mirrors.items():
        with open(name, "wb") as fh:
            fh.write(data)


def bench(
    label: str,
    gpus: int,
    workdir: Path,
    rounds: int = 1,
    minutes: int = 6,
    passes: int = 1,
    steady: bool = False,
    keep: bool = False,
    variants: Sequence[str] = ("current",),
) -> dict[str, object]:
    """Measure every step on a *minutes*-long trace, the last *passes* minutes held back
    for the incremental analyzer to pass over one by one (*steady*: only the steps of the
    controller's steady state: reading the mirrors, a cold pass, the incremental passes;
    *variants*: the incremental passes again per variant after the first, on the same
    store cut back between them)."""
    store = workdir / label
    load_before = os.getloadavg()[0]  # a shared machine: say how busy it was
    t0 = time.perf_counter()
    made = store / "simulated"  # --store DIR: a store kept from an earlier run of this shape
    shape = f"{gpus} {minutes} {os.environ.get('GUARDCTL_SEGMENT_MINUTES', '60')} {_handoff()}"
    if not keep or not made.exists() or made.read_text() != shape:
        shutil.rmtree(store, ignore_errors=True)
        # In a process of its own: the memory it took (gigabytes at 100k GPUs, not all given
        # back to the system) is not held beside the passes measured.
        subprocess.run(
            [sys.executable, __file__, "--simulate", str(store), str(gpus), str(minutes)],
            check=True,
        )
        made.write_text(shape)
    sim_s = time.perf_counter() - t0
    print(f"{label}: simulated {minutes} minutes in {sim_s:.0f} s", file=sys.stderr, flush=True)
    held, mirrors = hold_back(store, passes)  # the store *passes* minutes ago
    os.sync()  # the simulator's gigabytes written back first, not during the timed passes
    modes = (
        ("read_cols", "cold")
        if steady
        else ("read", "read_cols", "cold", "warm", "cold_json", "warm_json")
    )
    after = ("inc",) if steady else ("inc_json", "inc")
    others = [v for v in variants if v != "current"]
    steps: dict[str, list[dict[str, Any]]] = {
        m: [] for m in (*modes, "incremental", *others, *after)
    }
    for r in range(rounds):  # the machine may be shared: each round measures every step
        if r:
            _cut(held, mirrors)
            os.sync()
        for mode in modes:
            steps[mode].append(run_step(mode, store))
        # The incremental passes append the minutes (the steady state's on the minute grid).
        steps["incremental"].append(
            run_step("steady" if steady else "incremental", store, held=held)
        )
        for variant in others:  # the same minutes again, the store cut back first
            _cut(held, mirrors)
            os.sync()
            steps[variant].append(run_step(f"steady:{variant}", store, held=held))
        end = steps["incremental"][-1]["end"] if steady else None
        if r == rounds - 1:  # every minute appended: let them go before the last cold pass
            held = []  # (gigabytes at 100k GPUs, beside that pass's own)
        # Then the pass a cold analyzer makes over the same files: from the cache the JSON
        # passes left (parsing only the new tails), then from the mirrors (read whole).
        for mode in after:
            steps[mode].append(run_step(mode, store, end))
    if not keep:
        shutil.rmtree(store, ignore_errors=True)
    for run in ("incremental", *others):
        for inc, cold in zip(steps[run], steps["inc"], strict=True):
            if inc["digest"] != cold["digest"]:
                raise SystemExit(f"{label}: the incremental pass ({run}) differs from the cold")

    def best(mode: str, key: str = "seconds") -> float:
        return min(s[key] for s in steps[mode])

    def worst(mode: str, key: str = "seconds") -> float:
        return max(s[key] for s in steps[mode])

    ratios = {
        f"{m}_x": best(m) / best("read")
        for m in ("cold", "warm", "cold_json", "warm_json")
        if m in steps and "read" in steps
    }
    return {
        "fleet": label,
        "gpus": gpus,
        "rounds": rounds,
        "minutes": minutes,
        "steady": steady,
        "records": steps["cold"][0]["records"],
        "simulate_s": sim_s,
        **{f"{m}_s": best(m) for m in steps},
        **{f"{m}_s_max": worst(m) for m in steps},
        **{f"{m}_mib": worst(m, "peak_mib") for m in steps},
        "incremental_first_s": min(s["first_s"] for s in steps["incremental"]),
        "incremental_passes_s": steps["incremental"][0]["passes_s"],
        "incremental_passes_cpu_s": steps["incremental"][0]["passes_cpu_s"],
        "tables_kept": steps["incremental"][0]["tables_kept"],
        "mirror_files": steps["incremental"][0]["mirror_files"],
        "files_opened": steps["incremental"][0]["files_opened"],
        "open_files_limit": steps["incremental"][0]["open_files_limit"],
        "passes_peak_mib": max(s["passes_peak_mib"] for s in steps["incremental"]),
        "passes_mib": steps["incremental"][0]["passes_mib"],
        # after the last pass: per kind, the records kept and how far back (minutes)
        "kept": {
            kind: (n, (steps["incremental"][0]["end"] - oldest) / 60)
            for kind, (n, oldest) in steps["incremental"][0]["kept"].items()
        },
        "incremental_x": best("incremental") / best("inc"),
        **ratios,
        **({"mib": steps["read"][0]["bytes"] / 2**20} if "read" in steps else {}),
        "cols_mib": steps["read_cols"][0]["bytes"] / 2**20,
        "load_1min": (load_before, os.getloadavg()[0]),
        "variants": {v: _variant(steps["incremental" if v == "current" else v]) for v in variants},
    }


def _variant(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's passes after the first (every round's), their peak, processor time."""
    passes = [p for s in runs for p in s["passes_s"]]
    cpu = [c for s in runs for c in s["passes_cpu_s"]]
    return {
        "passes_s": (min(passes), max(passes)),
        "median_s": sorted(passes)[len(passes) // 2],
        "cpu_s": (min(cpu), max(cpu)),
        "cpu_median_s": sorted(cpu)[len(cpu) // 2],
        "passes_peak_mib": max(s["passes_peak_mib"] for s in runs),
        "peak_mib": max(s["peak_mib"] for s in runs),
        "first_s": min(s["first_s"] for s in runs),
    }


def variants_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fleet | variant | passes a minute apart s, min-max (median) | x current (median) "
        "| processor s a pass, median (x current) | peak MiB: passes / all (x current) "
        "| first pass s | load average |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = r["variants"]["current"]
        for name, v in r["variants"].items():
            low, high = v["passes_s"]
            lines.append(
                f"| {r['fleet']} GPUs | {name} | {low:.2f}-{high:.2f} ({v['median_s']:.2f}) "
                f"| {v['median_s'] / base['median_s']:.2f} "
                f"| {v['cpu_median_s']:.2f} ({v['cpu_median_s'] / base['cpu_median_s']:.2f}) "
                f"| {v['passes_peak_mib']:.0f} / {v['peak_mib']:.0f} "
                f"({v['passes_peak_mib'] / base['passes_peak_mib']:.2f}) "
                f"| {v['first_s']:.2f} "
                f"| {r['load_1min'][0]:.1f}-{r['load_1min'][1]:.1f} |"
            )
    return "\n".join(lines)


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


def steady_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fleet | records | cols MiB | read cols s | cold s (at the last minute) "
        "| incremental: first s / passes a minute apart s | last pass (x cold) "
        "| peak MiB cold / incremental (passes a minute apart, the last pass resident) "
        "| load average "
        "| processor s, each pass "
        "| files each pass read / opened (open-files limit) "
        "| kept after the last pass: step records (minutes back) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        times = r["incremental_passes_s"]
        pairs = r["incremental_passes_cpu_s"]
        pairs = pairs if len(pairs) <= 8 else pairs[-1:]  # (a long run: its last pass)
        cpu = " / ".join(f"{own:.2f}" for own in pairs)
        passes = " / ".join(f"{p:.2f}" for p in times)
        steps, back = r["kept"]["step"]
        read_opened = list(zip(r["mirror_files"], r["files_opened"], strict=True))
        read_opened = read_opened if len(read_opened) <= 8 else read_opened[-1:]
        files = "; ".join(f"{n:,}/{o:,}" for n, o in read_opened)
        files += f" ({r['open_files_limit']:,})"
        if len(times) > 8:  # a long run: its spread
            low, mid, high = min(times), sorted(times)[len(times) // 2], max(times)
            passes = f"{len(times)} passes {low:.2f} / median {mid:.2f} / {high:.2f}"
        lines.append(
            f"| {r['fleet']} GPUs | {r['records']:,} | {r['cols_mib']:.0f} "
            f"| {_range(r, 'read_cols')} | {_range(r, 'inc')} "
            f"| {r['incremental_first_s']:.2f} / {passes} "
            f"| {_range(r, 'incremental')} ({r['incremental_x']:.2f}x) "
            f"| {r['inc_mib']:.0f} / {r['incremental_mib']:.0f} "
            f"({r['passes_peak_mib']:.0f}, the last {r['passes_mib'][-1]:.0f}) "
            f"| {r['load_1min'][0]:.1f}-{r['load_1min'][1]:.1f} | {cpu} | {files} "
            f"| {steps:,} ({back:.1f}) |"
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
    parser.add_argument(
        "--steady",
        action="store_true",
        help="the controller's steady state: 21 minutes (three full windows), the last six "
        "passed over a minute at a time; only reading, cold and incremental passes",
    )
    parser.add_argument(
        "--segment-minutes",
        type=int,
        default=60,
        help="the writers' segment length ([store] segment_minutes): files cover this long",
    )
    parser.add_argument(
        "--handoff",
        action="store_true",
        help="ranks hand their steps to the node agent: one file per node and segment "
        "(default: a file per rank, as probes with no agent write)",
    )
    parser.add_argument(
        "--minutes",
        type=int,
        default=21,
        help="--steady: the trace's length (21: three full windows)",
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=6,
        help="--steady: its last minutes, passed over one at a time",
    )
    parser.add_argument(
        "--store",
        metavar="DIR",
        help="keep each fleet's store in DIR/<size> and use it again "
        "in a later run of the same shape (the simulation is most of a 100k run)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="--steady: write each incremental pass's cProfile "
        "statistics to DIR/pass-N.prof (its times then include the profiler's)",
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="--steady: the incremental passes also without the kept records' rings, "
        "without their packing, and without either, on the same store (see above)",
    )
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)  # MODE STORE [AT]
    parser.add_argument("--simulate", nargs=3, help=argparse.SUPPRESS)  # STORE GPUS MINUTES
    args = parser.parse_args()
    if args.simulate:
        from guardctl.simulate import simulate
        from guardctl.storage.segments import minutes_from_env

        store, gpus, minutes = args.simulate
        simulate(
            Path(store),
            nodes=int(gpus) // 8,
            duration=60.0 * int(minutes),
            interval=10.0,
            seed=1,
            faults="none",
            segment_minutes=minutes_from_env(),  # the parent's --segment-minutes
            handoff=_handoff(),
        )
        return 0
    if args.measure:
        mode, store, *at = args.measure
        print(json.dumps(measure(mode, store, float(at[0]) if at else None)))
        return 0
    sizes = args.sizes.split(",") if args.sizes else (["1k", "10k"] if args.quick else list(SIZES))
    rows = []
    os.environ["GUARDCTL_SEGMENT_MINUTES"] = str(args.segment_minutes)  # (the simulating child)
    os.environ[HANDOFF_ENV] = "1" if args.handoff else ""
    if args.profile:  # (read by the measuring child)
        os.makedirs(args.profile, exist_ok=True)
        os.environ["GUARDCTL_BENCH_PROFILE"] = os.path.abspath(args.profile)
    with tempfile.TemporaryDirectory(prefix="guardctl-scale-") as tmp:
        for label in sizes:
            steady = {"minutes": args.minutes, "passes": args.passes, "steady": True}
            shape: dict[str, Any] = steady if args.steady else {}
            if args.steady and args.variants:
                shape["variants"] = list(VARIANTS)
            where = Path(args.store) if args.store else Path(tmp)
            rows.append(
                bench(label, SIZES[label], where, args.rounds, keep=bool(args.store), **shape)
            )
            print(f"{label}: {json.dumps(rows[-1])}", file=sys.stderr)
    show = steady_table if args.steady else table
    print(json.dumps(rows, indent=1) if args.json else show(rows))
    if args.steady and args.variants and not args.json:
        print()
        print(variants_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
