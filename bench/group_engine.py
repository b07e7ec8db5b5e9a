#!/usr/bin/env python3
"""The windows' group-bys and quantiles on numpy (today's), polars and DuckDB, by measurement.

On a simulated fleet (1k, 10k or 100k GPUs, as ``bench/analyze_scale.py`` writes it: the
newest 6 minutes, 10 s apart) the records of each window are taken as
``features.extract`` takes them, and three pieces of the analyzer are figured by each
engine:

- ``gpu``: per (node, GPU, window) the GPU table's quantiles (clock, power, temperature,
  utilisation, power limit: the low quantile, the high one and the median);
- ``rank``: per (job, rank, window) the rank table's (compute time, its time per sample,
  communication time, step time);
- ``peers``: ``peer_stats`` (each row's peer group's median and MAD, and how many peers)
  on the GPU table, for the four columns the detectors compare with their peers.

Every quantile is the lower element (no interpolation) with NaN left out, as the analyzer
figures it; every engine's numbers must equal numpy's exactly, or the benchmark fails.

- ``numpy``: ``GroupIndex`` (rows grouped by key into a dense matrix, each row sorted) and
  ``peer_stats``; ``numpy quantiles`` is the quantiles alone, given the ``GroupIndex`` (which
  the tables build anyway: the counters and the time order need it; with 2 threads, the sum
  of each table's own time, two at once: not a wall-clock time);
- ``polars``: ``group_by(keys).agg(pl.col(c).quantile(q, "lower"))``, the groups sorted by
  key as numpy's are; ``polars groups`` groups by the ``GroupIndex``'s group number instead
  (what a switch inside ``GroupIndex.quantiles`` would do); peers by ``.over("peer")``;
- ``duckdb``: each group's values as a sorted list and the element picked
  (``quantile_disc`` picks element floor(q * n), not floor(q * (n - 1)): other numbers).

Each engine runs in a child process of its own per thread count (1 and 2: polars reads
``POLARS_MAX_THREADS`` when imported, DuckDB ``SET threads``; numpy sorts on one thread, so
with 2 it figures two windows' tables at once, as ``features.extract`` does, and two columns'
peer figures, as ``engine.run_detectors`` runs two detectors). Times are the
fastest of ``--rounds`` rounds, in seconds for every window's tables; memory is the child's
peak resident size (``ru_maxrss``: polars and DuckDB allocate outside Python's tracing),
and, in brackets, what it grew by after the records were loaded. Ratios are against numpy
with the same threads, in the same run.

    python bench/group_engine.py                       # 10k GPUs
    python bench/group_engine.py --sizes 10k,100k --rounds 3
    python bench/group_engine.py --sizes 10k --store DIR   # keep the simulated fleet

Takes the CPU for a while: run it alone (``flock`` a lock shared with other benchmarks).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

SIZES = {"1k": 1_000, "10k": 10_000, "100k": 100_000}
MINUTES = 6
ENGINES = ("numpy", "numpy quantiles", "polars", "polars groups", "duckdb")
PIECES = ("gpu", "rank", "peers")
GPU_KEYS = ("node", "gpu", "wrev")
RANK_KEYS = ("job", "rank", "wrev")
PEER_COLUMNS = ("temp_hi", "clock_lo", "power_lo", "util_med")
Task = tuple[dict[str, np.ndarray], tuple[str, ...], list[tuple[str, tuple[float, ...]]]]


def metrics(low_q: float) -> dict[str, list[tuple[str, tuple[float, ...]]]]:
    """Per table, the columns the analyzer takes quantiles of, and which (features.py)."""
    high = 1 - low_q
    return {
        "gpu": [
            ("sm_clock_mhz", (low_q, 0.5)),
            ("power_w", (low_q, 0.5)),
            ("temp_c", (high, 0.5)),
            ("util_pct", (0.5,)),
            ("power_limit_w", (0.5,)),
        ],
        "rank": [
            ("compute_s", (high, 0.5)),
            ("per_sample", (high,)),
            ("comm_s", (0.5,)),
            ("step_s", (0.5,)),
        ],
    }


# -- the records (a child: the frame's memory is let go with it) -------------------------


def write_inputs(store: Path, out: Path) -> dict[str, Any]:
    """Each window's GPU and step records, and the GPU table's peers, as extract takes them."""
    from guardctl.analyze import engine
    from guardctl.analyze import features as feat
    from guardctl.config import Settings

    settings = Settings()
    cfg = settings.analyze
    frame = engine.load_recent(store, settings, engine.steps_needed(cfg, None), float("inf"))
    at = engine.default_at(frame, cfg.window_s)
    assert at is not None, "no records in the store"
    ends = feat.step_times(frame)
    wins, _ = feat._assigned(frame, ends, at, cfg.window_s, cfg.persist_n)
    arrays: dict[str, np.ndarray] = {}
    rows = {"gpu": 0, "rank": 0}
    for w in range(cfg.persist_n):
        for table, kind, keys in (("gpu", "gpu", GPU_KEYS), ("rank", "step", RANK_KEYS)):
            picked = feat.Rows.window(wins[kind], w)
            if not np.count_nonzero(picked.keep):
                continue
            c = feat._rows(frame.cols[kind], picked.keep)
            cols = {k: np.asarray(c[k]) for k in keys if k != "wrev"}
            cols["wrev"], cols["ts"] = picked.wrev.astype(np.int64), np.asarray(c["ts"])
            if table == "rank":
                samples, compute = np.asarray(c["samples"]), np.asarray(c["compute_s"])
                per = np.full(samples.size, np.nan)
                ok = (samples != feat.INT_MISSING) & (samples > 0)
                np.divide(compute, samples, out=per, where=ok)
                cols["per_sample"] = per
            for name, _ in metrics(cfg.low_quantile)[table]:
                if name != "per_sample":
                    cols[name] = np.asarray(c[name], np.float64)
            for name, col in cols.items():
                arrays[f"{table}.{w}.{name}"] = col
            rows[table] += int(cols["ts"].size)
    f = engine_features(frame, at, cfg)
    arrays["peers.peer"] = np.asarray(f.gpu["peer"])
    arrays["peers.busy"] = f.gpu["util_med"] >= 50.0
    for name in PEER_COLUMNS:
        arrays[f"peers.{name}"] = np.asarray(f.gpu[name], np.float64)
    np.savez(out, **arrays)
    return {"gpu_rows": rows["gpu"], "rank_rows": rows["rank"], "gpu_table": len(f.gpu)}


def engine_features(frame: Any, at: float, cfg: Any) -> Any:
    from guardctl.analyze import features as feat

    return feat.extract(
        frame,
        at,
        cfg.window_s,
        cfg.persist_n,
        min_samples=cfg.min_samples,
        min_coverage=cfg.min_coverage,
        min_peers=cfg.min_peers,
        min_rank_peers=cfg.min_rank_peers,
        low_q=cfg.low_quantile,
        hw_xids=cfg.hardware_xids,
    )


def tasks(inputs: dict[str, np.ndarray], table: str, low_q: float) -> list[Task]:
    keys = GPU_KEYS if table == "gpu" else RANK_KEYS
    windows = sorted({int(k.split(".")[1]) for k in inputs if k.startswith(table + ".")})
    out = []
    for w in windows:
        cols = {k.split(".", 2)[2]: v for k, v in inputs.items() if k.startswith(f"{table}.{w}.")}
        out.append((cols, keys, metrics(low_q)[table]))
    return out


# -- the engines (each in a child of its own) ---------------------------------------------


def numpy_table(task: Task, quantiles_only: bool = False) -> tuple[list[np.ndarray], float]:
    from guardctl.analyze.features import GroupIndex

    cols, keys, wanted = task
    t0 = time.perf_counter()
    gi = GroupIndex(cols["ts"], *(cols[k] for k in keys))
    if quantiles_only:
        t0 = time.perf_counter()
    out = [q for name, qs in wanted for q in gi.quantiles(cols[name], qs)]
    return out, time.perf_counter() - t0


def polars_table(task: Task, by_group: bool = False) -> list[np.ndarray]:
    import polars as pl

    from guardctl.analyze.features import GroupIndex

    cols, keys, wanted = task
    frame: dict[str, Any] = {k: cols[k] for k in keys}
    group: tuple[str, ...] = keys
    if by_group:  # (the GroupIndex is not timed here: numpy quantiles' time leaves it out too)
        frame = {"g": GroupIndex(cols["ts"], *(cols[k] for k in keys)).inv}
        group = ("g",)
    df = pl.DataFrame(frame).with_columns(
        pl.Series(name, cols[name], nan_to_null=True) for name, _ in wanted
    )
    aggs = [
        pl.col(name).quantile(q, "lower").alias(f"{name}@{i}")
        for name, qs in wanted
        for i, q in enumerate(qs)
    ]
    res = df.group_by(group).agg(aggs).sort(group)
    return [
        res[f"{name}@{i}"].to_numpy().astype(np.float64)
        for name, qs in wanted
        for i in range(len(qs))
    ]


def duckdb_table(con: Any, task: Task) -> list[np.ndarray]:
    import pyarrow as pa

    cols, keys, wanted = task
    data = {k: cols[k] for k in keys}
    data.update({name: pa.array(cols[name], from_pandas=True) for name, _ in wanted})
    records = pa.table(data)
    con.register("records", records)
    key_list = ", ".join(keys)
    lists = ", ".join(
        f"list_sort(list({n}) FILTER (WHERE {n} IS NOT NULL)) AS {n}" for n, _ in wanted
    )
    picks = ", ".join(f'{_pick(n, q)} AS "{n}@{i}"' for n, qs in wanted for i, q in enumerate(qs))
    sql = (
        f"SELECT {picks} FROM (SELECT {key_list}, {lists} FROM records GROUP BY {key_list}) "
        f"ORDER BY {key_list}"
    )
    res = con.sql(sql).to_arrow_table()
    con.unregister("records")
    return [
        res.column(f"{n}@{i}").to_numpy(zero_copy_only=False).astype(np.float64)
        for n, qs in wanted
        for i in range(len(qs))
    ]


def _pick(column: str, q: float) -> str:
    """The lower element at *q* of a sorted list (1-based; NULL when empty)."""
    return f"{column}[CAST(floor({q!r} * (len({column}) - 1)) AS BIGINT) + 1]"


def numpy_peers(inputs: dict[str, np.ndarray], threads: int) -> list[np.ndarray]:
    """``peer_stats`` per column, the peers grouped once (as a table keeps them) and two
    columns at a time with 2 threads (as ``engine.run_detectors`` runs the detectors)."""
    from guardctl.analyze.groups import Grouping, peer_stats

    peers = Grouping.of(inputs["peers.peer"])
    busy = inputs["peers.busy"]
    with ThreadPoolExecutor(threads) as pool:
        done = pool.map(lambda n: peer_stats(peers, inputs[f"peers.{n}"], busy), PEER_COLUMNS)
        return [a for got in done for a in got]


def polars_peers(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The same per column, as a detector would ask (its own values and rows each time)."""
    import polars as pl

    busy = inputs["peers.busy"]
    out = []
    for n in PEER_COLUMNS:
        values = pl.Series("v", np.where(busy, inputs[f"peers.{n}"], np.nan), nan_to_null=True)
        df = pl.DataFrame({"peer": inputs["peers.peer"]}).with_columns(values)
        df = df.with_columns(
            pl.col("v").quantile(0.5, "lower").over("peer").alias("med"),
            pl.col("v").count().over("peer").alias("cnt"),
        )
        df = df.with_columns(
            (pl.col("v") - pl.col("med")).abs().quantile(0.5, "lower").over("peer").alias("mad")
        )
        out += [
            df["med"].to_numpy().astype(np.float64),
            df["mad"].to_numpy().astype(np.float64),
            df["cnt"].to_numpy().astype(np.int64),
        ]
    return out


def duckdb_peers(con: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import pyarrow as pa

    busy = inputs["peers.busy"]
    data: dict[str, Any] = {"row": np.arange(busy.size), "peer": inputs["peers.peer"]}
    for n in PEER_COLUMNS:
        data[n] = pa.array(np.where(busy, inputs[f"peers.{n}"], np.nan), from_pandas=True)
    con.register("gpus", pa.table(data))
    out = []
    for n in PEER_COLUMNS:
        sql = f"""
            WITH m AS (SELECT peer, {_pick("s", 0.5)} AS med, coalesce(len(s), 0) AS cnt FROM
                (SELECT peer, list_sort(list({n}) FILTER (WHERE {n} IS NOT NULL)) AS s
                 FROM gpus GROUP BY peer)),
            d AS (SELECT peer, {_pick("s", 0.5)} AS mad FROM
                (SELECT g.peer, list_sort(list(abs(g.{n} - m.med))
                        FILTER (WHERE g.{n} IS NOT NULL)) AS s
                 FROM gpus g JOIN m USING (peer) GROUP BY g.peer))
            SELECT m.med, d.mad, m.cnt FROM gpus JOIN m USING (peer) JOIN d USING (peer)
            ORDER BY gpus.row"""
        res = con.sql(sql).to_arrow_table()
        out += [
            res.column("med").to_numpy(zero_copy_only=False).astype(np.float64),
            res.column("mad").to_numpy(zero_copy_only=False).astype(np.float64),
            res.column("cnt").to_numpy(zero_copy_only=False).astype(np.int64),
        ]
    con.unregister("gpus")
    return out


def run_engine(engine: str, threads: int, inputs_path: Path, out: Path, rounds: int) -> None:
    """In a child: time *engine* on every piece, keep its numbers for the parent to compare."""
    inputs = dict(np.load(inputs_path))
    low_q = float(json.loads((inputs_path.parent / "shape.json").read_text())["low_q"])
    base = _maxrss_mib()
    con = None
    if engine == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.execute(f"SET threads = {threads}")
    times: dict[str, float] = {}
    results: dict[str, np.ndarray] = {}
    for piece in PIECES:
        best = float("inf")
        for _ in range(rounds):
            got, seconds = _timed_piece(engine, piece, inputs, low_q, threads, con)
            best = min(best, seconds)
        times[piece] = best
        for i, a in enumerate(got):
            results[f"{piece}.{i}"] = a
    np.savez(out, **results)
    peak = _maxrss_mib()
    print(json.dumps({"times": times, "peak_mib": peak, "grew_mib": peak - base}))


def _timed_piece(
    engine: str, piece: str, inputs: dict[str, np.ndarray], low_q: float, threads: int, con: Any
) -> tuple[list[np.ndarray], float]:
    if piece == "peers":
        fn: Callable[[], list[np.ndarray]] = {
            "polars": lambda: polars_peers(inputs),
            "polars groups": lambda: polars_peers(inputs),
            "duckdb": lambda: duckdb_peers(con, inputs),
        }.get(engine, lambda: numpy_peers(inputs, threads))
        t0 = time.perf_counter()
        got = fn()
        return got, time.perf_counter() - t0
    work = tasks(inputs, piece, low_q)
    if engine.startswith("numpy"):  # two windows' tables at once with 2 threads, as extract
        only = engine == "numpy quantiles"
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            done = list(pool.map(lambda t: numpy_table(t, only), work))
        seconds = time.perf_counter() - t0
        if only:
            seconds = sum(s for _, s in done)
        return [a for got, _ in done for a in got], seconds
    if engine == "polars groups":  # the GroupIndex each needs is built before the clock
        t0 = time.perf_counter()
        got = [a for t in work for a in polars_table(t, by_group=True)]
        return got, time.perf_counter() - t0 - _groupindex_s(work)
    t0 = time.perf_counter()
    if engine == "polars":
        got = [a for t in work for a in polars_table(t)]
    else:
        got = [a for t in work for a in duckdb_table(con, t)]
    return got, time.perf_counter() - t0


def _groupindex_s(work: list[Task]) -> float:
    from guardctl.analyze.features import GroupIndex

    t0 = time.perf_counter()
    for cols, keys, _ in work:
        GroupIndex(cols["ts"], *(cols[k] for k in keys))
    return time.perf_counter() - t0


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the parent ----------------------------------------------------------------------------


def _child(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:2])}: failed\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def bench(label: str, gpus: int, workdir: Path, rounds: int, threads: Sequence[int]) -> list[dict]:
    from guardctl.config import Settings

    store = workdir / label
    made = store / "simulated"
    shape = f"{gpus} {MINUTES}"
    if not made.exists() or made.read_text() != shape:
        shutil.rmtree(store, ignore_errors=True)
        subprocess.run([sys.executable, __file__, "--simulate", str(store), str(gpus)], check=True)
        made.write_text(shape)
    work = workdir / f"{label}.work"
    work.mkdir(exist_ok=True)
    low_q = Settings().analyze.low_quantile
    (work / "shape.json").write_text(json.dumps({"low_q": low_q}))
    inputs = work / "inputs.npz"
    sizes = _child("--inputs", str(store), str(inputs))
    rows = []
    for n in threads:
        reference: dict[str, np.ndarray] | None = None
        for engine in ENGINES:
            out = work / f"{engine.replace(' ', '_')}.{n}.npz"
            env = {"POLARS_MAX_THREADS": str(n)}
            res = _child("--run", engine, str(n), str(inputs), str(out), str(rounds), env=env)
            got = dict(np.load(out))
            if reference is None:
                reference = got
            _same(reference, got, engine)
            rows.append({"size": label, "threads": n, "engine": engine, **sizes, **res})
            print(f"{label} {n} thread(s) {engine}: {res}", file=sys.stderr, flush=True)
    return rows


def _same(want: dict[str, np.ndarray], got: dict[str, np.ndarray], engine: str) -> None:
    """Fail unless *engine*'s numbers are numpy's, bit for bit (NaN where numpy's are)."""
    assert want.keys() == got.keys(), f"{engine}: other outputs"
    for key, w in want.items():
        g = got[key]
        if not np.array_equal(w, g, equal_nan=True):
            bad = np.flatnonzero(~((w == g) | (np.isnan(w) & np.isnan(g))))
            raise SystemExit(
                f"{engine}: {key} differs from numpy in {bad.size} of {w.size} groups "
                f"(first: {w[bad[0]]!r} against {g[bad[0]]!r})"
            )


def table(rows: list[dict], load: float) -> str:
    """Markdown: per size and thread count, each engine's time per piece and memory."""
    base = {(r["size"], r["threads"]): r["times"] for r in rows if r["engine"] == "numpy"}
    out = [
        f"load average before: {load:.2f}",
        "",
        "| GPUs | threads | engine | gpu s | rank s | peers s | peak MiB (grew) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = base[(r["size"], r["threads"])]
        cells = [
            f"{r['times'][p]:.3f} ({r['times'][p] / ref[p]:.2f}x)" if ref[p] else "-"
            for p in PIECES
        ]
        out.append(
            f"| {r['size']} | {r['threads']} | {r['engine']} | {' | '.join(cells)} | "
            f"{r['peak_mib']:.0f} ({r['grew_mib']:.0f}) |"
        )
    first = {r["size"]: r for r in rows}
    out.append("")
    for size, r in first.items():
        out.append(
            f"{size}: {r['gpu_rows']} GPU records, {r['rank_rows']} step records in the windows; "
            f"{r['gpu_table']} GPU table rows"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10k", help="comma-separated: " + ",".join(SIZES))
    parser.add_argument("--rounds", type=int, default=3, help="the fastest of N rounds")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--store", help="keep the simulated fleets in DIR for later runs")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    parser.add_argument("--simulate", nargs=2, help=argparse.SUPPRESS)  # STORE GPUS
    parser.add_argument("--inputs", nargs=2, help=argparse.SUPPRESS)  # STORE OUT
    parser.add_argument("--run", nargs=5, help=argparse.SUPPRESS)  # ENGINE N IN OUT ROUNDS
    args = parser.parse_args()
    if args.simulate:
        from guardctl.simulate import simulate

        store, gpus = args.simulate
        simulate(
            Path(store),
            nodes=int(gpus) // 8,
            duration=60.0 * MINUTES,
            interval=10.0,
            seed=1,
            faults="none",
        )
        return 0
    if args.inputs:
        print(json.dumps(write_inputs(Path(args.inputs[0]), Path(args.inputs[1]))))
        return 0
    if args.run:
        engine, n, inputs, out, rounds = args.run
        run_engine(engine, int(n), Path(inputs), Path(out), int(rounds))
        return 0
    load = os.getloadavg()[0]
    threads = [int(n) for n in args.threads.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="guardctl-groups-") as tmp:
        where = Path(args.store) if args.store else Path(tmp)
        for label in args.sizes.split(","):
            rows += bench(label, SIZES[label], where, args.rounds, threads)
            shutil.rmtree(where / f"{label}.work", ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
