"""The vectorised group statistics agree with plain per-group Python on awkward data."""

from __future__ import annotations

import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from guardctl.analyze import features
from guardctl.analyze.engine import default_at, feature_settings, load_recent, steps_needed
from guardctl.analyze.features import (
    GroupIndex,
    _interval,
    _rows,
    assign_windows,
)
from guardctl.analyze.frame import INT_MISSING, Frame
from guardctl.analyze.groups import group_quantiles, peer_stats
from guardctl.config import Settings
from guardctl.simulate import simulate


def _reference(groups: dict[int, list[float]], q: float) -> dict[int, float]:
    out = {}
    for g, vals in groups.items():
        vals = sorted(v for v in vals if not math.isnan(v))
        out[g] = vals[math.floor(q * (len(vals) - 1))] if vals else math.nan
    return out


@pytest.mark.parametrize("huge_group", [False, True])
def test_group_index_quantiles_match_a_plain_computation(huge_group: bool) -> None:
    rng = np.random.default_rng(1)
    n = 5000
    a = rng.integers(0, 40, n)
    b = rng.integers(-1, 3, n)  # -1 is a valid key ("no job")
    if huge_group:  # one group far larger than the rest: the matrix layout is not used
        a[: n // 2], b[: n // 2] = 7, 2
    ts = rng.permutation(n).astype(float)  # out of order
    values = rng.normal(size=n)
    values[rng.random(n) < 0.1] = np.nan
    gi = GroupIndex(ts, a, b)
    assert gi.dense is not huge_group
    lo, med = gi.quantiles(values, (0.3, 0.5))
    ref_lo: dict[int, list[float]] = {}
    for i in range(n):
        ref_lo.setdefault(int(gi.inv[i]), []).append(float(values[i]))
    for q, got in ((0.3, lo), (0.5, med)):
        want = _reference(ref_lo, q)
        for g, w in want.items():
            assert (math.isnan(w) and math.isnan(got[g])) or got[g] == w
    # each group's keys come back
    for i in range(0, n, 97):
        g = gi.inv[i]
        assert (gi.keys[0][g], gi.keys[1][g]) == (a[i], b[i])
    # each group's rows in time order, the groups in order (placed in the matrix, or sorted
    # when first asked for)
    np.testing.assert_array_equal(gi.time_order(), np.lexsort((ts, gi.inv)))
    first, last = gi.first_last(ts)
    np.testing.assert_array_equal(first, gi.quantiles(ts, (0.0,))[0])
    np.testing.assert_array_equal(last, gi.quantiles(ts, (1.0,))[0])
    # and the generic path says the same
    generic = group_quantiles(gi.inv, gi.n, values, (0.3,))[0]
    np.testing.assert_array_equal(generic, lo)
    # the least and largest value per group are the bottom and top quantiles, found
    # without sorting
    roles = rng.integers(-1, 9, n)
    least, largest = gi.extremes(roles)
    bottom, top = gi.quantiles(roles.astype(np.float64), (0.0, 1.0))
    np.testing.assert_array_equal(least, bottom.astype(np.int64))
    np.testing.assert_array_equal(largest, top.astype(np.int64))
    assert largest.dtype == np.int64 and GroupIndex(ts[:0], a[:0]).extremes(roles[:0])[1].size == 0


def test_a_few_groups_written_out_of_order_are_put_in_time_order() -> None:
    # Agents append in time order; a rank whose clock is behind its job's may not. Only
    # those groups are sorted: the order must be the same as sorting every group.
    rng = np.random.default_rng(3)
    groups, per = 400, 12
    key = np.repeat(np.arange(groups), per)
    step = np.tile(np.arange(per, dtype=float), groups)
    ts = step + key * 0.001
    ts[rng.random(ts.size) < 0.2] = 5.0  # ties keep the order written
    for g in rng.choice(groups, 9, replace=False):
        rows = np.flatnonzero(key == g)
        ts[rows] = ts[rows][rng.permutation(per)]
    written = np.argsort(step, kind="stable")  # groups interleaved, each in its own order
    ts, key = ts[written], key[written]
    gi = GroupIndex(ts, key)
    assert gi.dense
    np.testing.assert_array_equal(gi.time_order(), np.lexsort((ts, gi.inv)))
    first, last = gi.first_last(ts)
    np.testing.assert_array_equal(first, [ts[key == g].min() for g in range(groups)])
    np.testing.assert_array_equal(last, [ts[key == g].max() for g in range(groups)])


def test_counter_increase_follows_time_not_file_order_and_ignores_resets() -> None:
    ts = np.array([30.0, 10.0, 20.0, 40.0, 50.0, 10.0, 20.0])
    series = np.array([0, 0, 0, 0, 0, 1, 1])
    counter = np.array([12, 5, 7, 0, 3, INT_MISSING, 9], np.int64)  # reset between 30 and 40
    window = np.array([0, 0, 0, 1, 1, 0, 0])  # oldest first
    gi = GroupIndex(ts, series, window)
    inc = gi.increase(series, counter)
    by_key = {(int(k0), int(k1)): v for k0, k1, v in zip(*gi.keys, inc, strict=True)}
    # 5 -> 7 -> 12 in window 0; 12 -> 0 (reset: 0) -> 3 in window 1; a missing value: 0
    assert by_key == {(0, 0): 7.0, (0, 1): 3.0, (1, 0): 0.0}


@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 20])
def test_counter_increase_taken_a_run_of_rows_at_a_time_is_the_whole(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The increase is summed run by run (features.CHUNK rows in time order): a step across
    # the edge of two runs counts once, and a new series' first row never counts.
    monkeypatch.setattr(features, "CHUNK", chunk)
    rng = np.random.default_rng(11)
    n = 300
    series = rng.integers(0, 6, n)
    window = rng.integers(0, 3, n)
    ts = rng.permutation(n).astype(float)
    counter = rng.integers(0, 5, n).cumsum()
    counter[rng.random(n) < 0.1] = INT_MISSING
    counter[rng.random(n) < 0.05] = 0  # resets
    gi = GroupIndex(ts, series, window)
    got = gi.increase(series, counter)
    want = np.zeros(gi.n)
    for s in range(6):
        rows = np.flatnonzero(series == s)
        rows = rows[np.lexsort((ts[rows], window[rows]))]  # the series in time order
        for a, b in itertools.pairwise(rows):
            if INT_MISSING not in (counter[a], counter[b]) and counter[b] > counter[a]:
                want[gi.inv[b]] += counter[b] - counter[a]
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float64


@pytest.mark.parametrize(
    "keep, run",
    [
        ([0, 1, 1, 1, 0, 0], True),  # one window of records kept in minute order
        ([1, 1, 1, 1, 1, 1], True),
        ([0, 0, 0, 0, 0, 1], True),
        ([0, 1, 0, 1, 0, 0], False),  # records of the window apart: copied
        ([0, 0, 0, 0, 0, 0], False),
    ],
)
def test_a_tables_rows_are_read_in_place_when_they_lie_together(keep: list[int], run: bool) -> None:
    cols = {"ts": np.arange(6.0), "node": np.arange(6, dtype=np.int32) * 10}
    mask = np.array(keep, bool)
    got = _rows(cols, mask)
    assert got["ts"].tolist() == cols["ts"][mask].tolist()
    assert got["node"].tolist() == cols["node"][mask].tolist()
    assert np.shares_memory(got["ts"], cols["ts"]) is run


def test_windows_are_assigned_chunk_by_chunk_as_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from guardctl.analyze import features

    rng = np.random.default_rng(5)
    ts = rng.uniform(-100.0, 1000.0, 1001)
    ts[::97] = np.nan
    ts[5], ts[6], ts[7] = np.inf, -np.inf, 600.0  # no time, and a record on an edge
    whole = assign_windows(ts, 900.0, 300.0, 3)
    monkeypatch.setattr(features, "CHUNK", 64)
    assert assign_windows(ts, 900.0, 300.0, 3).tolist() == whole.tolist()
    want = np.floor((900.0 - ts) / 300.0)
    want[~((want >= 0) & (want < 3))] = -1
    assert whole.tolist() == want.astype(int).tolist()


@pytest.mark.parametrize("threads", [2, 3])
def test_steps_placed_by_several_threads_are_placed_as_by_one(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    # Jobs of very unequal sizes (one holds most records), records of no job, out of order:
    # each record's job's median time for its step, whatever thread placed it.
    rng = np.random.default_rng(11)
    n = 20_000
    job = rng.choice([-1, 0, 1, 2, 3], n, p=[0.02, 0.7, 0.2, 0.06, 0.02])
    step = rng.integers(100, 140, n)
    ts = step * 10.0 + rng.normal(0, 0.5, n)
    one = features.step_ends(ts, job, step)
    want = np.empty(n)
    for key in set(zip(job.tolist(), step.tolist(), strict=True)):
        mine = (job == key[0]) & (step == key[1])
        times = np.sort(ts[mine])
        want[mine] = times[(times.size - 1) // 2]
    np.testing.assert_array_equal(one, want)
    monkeypatch.setattr(features, "_SPLIT_ROWS", 1000)
    shares = features._shares(job, threads)
    assert all(np.unique(shares[job == j]).size == 1 for j in range(-1, 4))  # whole jobs
    assert np.unique(shares).size == threads
    np.testing.assert_array_equal(features.step_ends(ts, job, step, threads), one)


@pytest.mark.parametrize("ngroups", [50_000, 70_000], ids=["16-bit groups", "more groups"])
def test_group_quantiles_pick_exactly_among_values_a_few_ulps_apart(ngroups: int) -> None:
    """Values that differ in their last bits (a MAD's |value - median|, 1.8 figured two ways)
    sort as they compare: the lower element is the least, not the first written. Groups
    without values get NaN; one group of half the rows is no different."""
    rng = np.random.default_rng(6)
    near = np.nextafter(1.8, 2.0)
    # Per group the values written [1.8 + 1 ulp, 1.8, far]: the least is the one in the middle.
    groups = np.repeat(np.arange(0, ngroups, 2), 3)  # the odd groups hold nothing
    values = np.tile([near, 1.8, 0.0], ngroups // 2)
    values[2::3] = rng.uniform(100.0, 1000.0, ngroups // 2)
    groups = np.concatenate([groups, np.full(groups.size, 7)])  # and a group of half the rows
    values = np.concatenate([values, rng.normal(size=values.size)])
    values[rng.random(values.size) < 0.05] = np.nan
    by: dict[int, list[float]] = {g: [] for g in range(ngroups)}
    for g, v in zip(groups.tolist(), values.tolist(), strict=True):
        by[g].append(v)
    for q in (0.0, 0.3, 0.5, 1.0):
        got = group_quantiles(groups, ngroups, values, (q,))[0].tolist()
        want = _reference(by, q)
        assert [None if math.isnan(x) else x for x in got] == [
            None if math.isnan(want[g]) else want[g] for g in range(ngroups)
        ]


def _plain_peer_stats(peers: np.ndarray, values: np.ndarray, mask: np.ndarray) -> list[tuple]:
    """Per row: (median, MAD, count) of its peer group's values where *mask*, in Python."""
    groups: dict[int, list[float]] = {}
    for p, v, m in zip(peers.tolist(), values.tolist(), mask.tolist(), strict=True):
        groups.setdefault(p, [])
        if m and not math.isnan(v):
            groups[p].append(v)
    med = _reference(groups, 0.5)
    mad = _reference({g: [abs(v - med[g]) for v in vals] for g, vals in groups.items()}, 0.5)
    return [(med[p], mad[p], len(groups[p])) for p in peers.tolist()]


def test_a_table_groups_each_peer_column_once_and_anew_when_it_is_replaced() -> None:
    """The detectors ask for a table's peer groups again and again: the table keeps them
    with the column they are of, and a column put in its place gets its own groups."""
    rng = np.random.default_rng(3)
    n = 3000
    values = rng.normal(size=n)
    mask = rng.random(n) < 0.8
    first = rng.integers(0, 30, n)
    other = rng.integers(0, 30, n)  # same length and type, other groups
    t = features.Table({"peer": first})
    kept = t.grouping("peer")
    assert t.grouping("peer") is kept
    for peers in (first, other, first):
        t["peer"] = peers.copy()
        got = list(
            zip(*(a.tolist() for a in peer_stats(t.grouping("peer"), values, mask)), strict=True)
        )
        assert got == _plain_peer_stats(peers, values, mask)
    t.cols["peer"] = other  # (put straight into the columns: still a column of its own)
    got = list(
        zip(*(a.tolist() for a in peer_stats(t.grouping("peer"), values, mask)), strict=True)
    )
    assert got == _plain_peer_stats(other, values, mask)


def test_tables_judged_at_once_keep_their_own_peer_groups() -> None:
    """Detectors run two at a time, each pass's tables their own: one table's groups are
    never another's, whatever order the threads ask in."""
    rng = np.random.default_rng(4)
    n = 2000
    values = rng.normal(size=n)
    mask = np.ones(n, bool)
    tables = [features.Table({"peer": rng.integers(0, k, n)}) for k in (3, 30, 300, 3000)]
    want = [_plain_peer_stats(t["peer"], values, mask) for t in tables]

    def judge(i: int) -> list[tuple]:
        t = tables[i % len(tables)]
        return list(
            zip(*(a.tolist() for a in peer_stats(t.grouping("peer"), values, mask)), strict=True)
        )

    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(judge, range(4 * len(tables))))
    assert got == [want[i % len(tables)] for i in range(4 * len(tables))]


@pytest.mark.parametrize("in_time_order", [True, False], ids=["written-in-order", "out-of-order"])
def test_the_sampling_interval_is_the_median_gap_within_each_series(in_time_order: bool) -> None:
    """Sorted by series alone where the records are in time order within each, else by time
    too: either way the median of the gaps a full sort gives."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(2, 400))
        node = rng.integers(0, 6, n).astype(np.int32)
        ts = np.round(rng.random(n) * 120, 1)
        if in_time_order:
            order = np.argsort(ts, kind="stable")
            node, ts = node[order], ts[order]
        frame = Frame()
        frame.cols["host"] = {"ts": ts, "node": node}
        frame.cols["gpu"] = {"ts": ts[:0], "node": node[:0], "gpu": node[:0]}
        wins = {"host": np.zeros(n, np.int8), "gpu": np.zeros(0, np.int8)}
        order = np.lexsort((ts, node))
        same = node[order][1:] == node[order][:-1]
        gaps = np.diff(ts[order])[same]
        gaps = gaps[gaps > 0]
        assert _interval(frame, wins) == (float(np.median(gaps)) if gaps.size else 0.0)


def test_kept_window_tables_held_narrow_join_as_the_wide_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window's tables keep their integer columns in 32 bits where they fit; the joined
    tables are the same, column by column and type by type, as without that."""
    simulate(tmp_path, nodes=24, duration=1200.0, seed=5, faults="all", start=1_764_547_200.0)
    settings = Settings()
    cfg = settings.analyze
    frame = load_recent(tmp_path, settings, steps_needed(cfg))
    at = default_at(frame, cfg.window_s)
    assert at is not None
    kw = feature_settings(cfg)
    kept = features.Kept()
    narrow = features.extract_again(frame, at, cfg.window_s, cfg.persist_n, kept, **kw)
    held = [t for part in kept.parts.values() for t in part.tables.values()]
    assert any(t.narrowed for t in held)
    assert all(t[c].dtype == np.int32 for t in held for c in t.narrowed)
    monkeypatch.setattr(features, "_narrowed", lambda t: t)
    wide = features.extract(frame, at, cfg.window_s, cfg.persist_n, **kw)
    for name in ("gpu", "host", "nic", "rank"):
        a, b = getattr(narrow, name), getattr(wide, name)
        assert list(a.cols) == list(b.cols) and len(a) > 0
        for col in a.cols:
            assert a[col].dtype == b[col].dtype, (name, col)
            assert np.array_equal(a[col], b[col], equal_nan=a[col].dtype.kind == "f"), (name, col)
