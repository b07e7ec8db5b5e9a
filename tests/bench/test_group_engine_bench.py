"""The group-engine benchmark's engines figure the analyzer's numbers, on awkward data.

Speeds are not judged here: each engine's quantiles and peer figures must equal numpy's
bit for bit (the benchmark fails otherwise), with NaN values, groups without a value, one
group of most of the rows and values a few ulps apart; and a difference is caught.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from benchtools import bench_module

pytest.importorskip("polars")
pytest.importorskip("duckdb")


def _module() -> Any:
    return bench_module("group_engine")


def _inputs(bench: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(8)
    n = 4000
    out: dict[str, np.ndarray] = {}
    for table, keys in (("gpu", bench.GPU_KEYS), ("rank", bench.RANK_KEYS)):
        for w in (0, 1):
            cols = {k: rng.integers(-1, 6, n) for k in keys}
            cols[keys[0]][: n // 2] = 3  # one group of half the rows: no dense matrix
            cols[keys[1]][: n // 2] = 2
            cols["wrev"] = np.full(n, w, np.int64)
            cols["ts"] = rng.permutation(n).astype(np.float64)
            for name, _ in bench.metrics(0.3)[table]:
                v = np.where(rng.random(n) < 0.5, 1.8, np.nextafter(1.8, 2.0))
                spread = rng.random(n) < 0.3
                v[spread] = rng.normal(size=int(spread.sum()))
                v[rng.random(n) < 0.1] = np.nan
                v[cols[keys[1]] == 5] = np.nan  # groups without a value
                cols[name] = v
            out.update({f"{table}.{w}.{k}": v for k, v in cols.items()})
    peers = rng.integers(0, 40, n)
    out["peers.peer"] = peers
    out["peers.busy"] = rng.random(n) < 0.7
    for name in bench.PEER_COLUMNS:
        v = rng.normal(size=n).round(1) + 1.8  # many ties, and differences a few ulps apart
        v[peers == 39] = np.nan
        out[f"peers.{name}"] = v
    return out


def _figures(bench: Any, engine: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import duckdb

    con = duckdb.connect()
    out: list[np.ndarray] = []
    for piece in bench.PIECES:
        got, _ = bench._timed_piece(engine, piece, inputs, 0.3, 2, con)
        out += got
    return out


@pytest.mark.parametrize("engine", ["numpy quantiles", "polars", "polars groups", "duckdb"])
def test_every_engine_figures_numpys_numbers(engine: str) -> None:
    bench = _module()
    inputs = _inputs(bench)
    want = _figures(bench, "numpy", inputs)
    got = _figures(bench, engine, inputs)
    assert len(got) == len(want)
    bench._same(
        {str(i): a for i, a in enumerate(want)}, {str(i): a for i, a in enumerate(got)}, engine
    )
    assert any(np.isnan(a).any() for a in want)  # the awkward cases are there


def test_a_difference_fails_the_benchmark() -> None:
    bench = _module()
    want = {"gpu.0": np.array([1.8, np.nan, 2.0])}
    bench._same(want, {"gpu.0": np.array([1.8, np.nan, 2.0])}, "same")
    with pytest.raises(SystemExit, match="1 of 3"):
        bench._same(want, {"gpu.0": np.array([np.nextafter(1.8, 2.0), np.nan, 2.0])}, "other")
