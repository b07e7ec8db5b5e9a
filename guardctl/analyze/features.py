"""Feature extraction: per window, per GPU / node / NIC port / rank summaries, and their peers.

Everything here is vectorised over whole columns: records are assigned to the
windows ending at ``at`` (window 0 is the newest), grouped, and summarised with
order statistics (a low or high quantile, so that one odd sample moves
nothing and a fault must hold in a share of the window to show). Cumulative
counters become their increase over the window (a reset counts as zero, never
as a negative change). Each row also gets its *peer group*: the job the node
ran in that window (from step records, else from the job its GPU records name)
when that job is big enough, else every row of that window without one.

Each window's tables are figured from its records alone and then joined; the
peers and a counter's step across a window's edge are given at the join, so a
caller that judges the same window again can keep its tables (:func:`extract_again`: the
incremental analyzer's passes a minute apart).
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from guardctl.analyze.frame import INT_MISSING, Columns, Frame
from guardctl.analyze.groups import Grouping, group_count, group_median, group_quantiles
from guardctl.analyze.packing import PackedColumns

# NVML clock-event reasons that mean the hardware slowed the GPU (not idle / SW power cap /
# sync boost): HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80.
FAULT_REASON_BITS = 0x8 | 0x20 | 0x40 | 0x80
NO_PEER = -1
_INT32 = np.iinfo(np.int32)


@dataclass
class Table:
    """Rows of one feature table: equal-length columns."""

    cols: dict[str, np.ndarray] = field(default_factory=dict)
    # Columns of 64-bit integers held in 32 bits (a window's tables kept for later passes:
    # see _narrowed), made 64-bit again where windows are joined.
    narrowed: frozenset[str] = frozenset()
    # Each column's grouping, once figured, with the column it is of (a column replaced is
    # grouped afresh). It lives as long as the figures it describes; two detectors reading
    # the table at once may both figure one, and keep either: they are the same.
    _groupings: dict[str, tuple[np.ndarray, Grouping]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.cols[name] = value

    def grouping(self, name: str) -> Grouping:
        """Column *name*'s rows grouped by value (e.g. ``peer``: each row's peer group)."""
        col = self.cols[name]
        kept = self._groupings.get(name)
        if kept is not None and kept[0] is col:
            return kept[1]
        grouping = Grouping.of(col)
        self._groupings[name] = (col, grouping)
        return grouping

    def __len__(self) -> int:
        return int(next(iter(self.cols.values())).size) if self.cols else 0


@dataclass
class Features:
    """All feature tables of one analysis, for ``n_windows`` windows ending at ``at``."""

    at: float
    window_s: float
    n_windows: int
    nodes: list[str]
    jobs: list[str]
    ports: list[str]
    gpu: Table
    host: Table
    nic: Table
    rank: Table
    has_data: np.ndarray  # (n_windows, n_nodes): enough samples to judge
    seen: np.ndarray  # (n_windows, n_nodes): any record at all
    node_job: np.ndarray  # (n_windows, n_nodes): job index or -1
    # Per (job, window) of the windows before the judged ones: the job's step time there
    # (:func:`job_steps`), what each job's own pace is judged against.
    history_steps: Table = field(default_factory=Table)

    def window_bounds(self, w: int) -> tuple[float, float]:
        end = self.at - w * self.window_s
        return end - self.window_s, end


# Records a whole-column step takes at a time: its scratch (8 MB of floats) is used again
# chunk after chunk, where one scratch the column's length (hundreds of MB at 100k GPUs) is
# memory the process touches afresh every pass (on a virtual machine, as costly as the work).
CHUNK = 1 << 20


def assign_windows(ts: np.ndarray, at: float, window_s: float, n: int) -> np.ndarray:
    """Window index per record (0 newest); -1 when outside the n windows (or no time)."""
    out = np.empty(ts.size, np.int8 if n < 127 else np.int64)  # small: scanned per table
    scratch = np.empty(min(ts.size, CHUNK))
    for lo in range(0, ts.size, CHUNK):
        part = ts[lo : lo + CHUNK]
        w = scratch[: part.size]
        np.subtract(at, part, out=w)
        w /= window_s
        np.floor(w, out=w)
        w[~((w >= 0) & (w < n))] = -1  # after *at* (negative), too old, or NaN
        out[lo : lo + part.size] = w
    return out


def _mixed_key(keys: tuple[np.ndarray, ...], offset: int = 0) -> tuple[np.ndarray, int, list[int]]:
    """One int64 key per row from several small integer keys (mixed radix), each at least
    -*offset*; and the key space and each key's radix. (In place: no temporary per key.)"""
    key = np.zeros(keys[0].size, np.int64)
    space, sizes = 1, []
    for k in keys:
        size = int(k.max()) + 1 + offset if k.size else 1
        key *= size
        key += k
        if offset:
            key += offset
        space *= size
        sizes.append(size)
    return key, space, sizes


def _groups(
    *keys: np.ndarray, inverse: bool = True
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Group rows by several integer keys; return inverse index, count and each key per group.

    Groups come out ordered by the keys (the first key most significant). Without
    *inverse*, the inverse index is left out (empty): a column the rows' length less.
    """
    if not keys[0].size:
        return np.empty(0, np.int64), np.empty(0, np.int64), [np.empty(0, np.int64) for _ in keys]
    key, space, sizes = _mixed_key(keys, offset=1)  # keys may be -1
    inv = np.empty(0, np.int64)
    if space <= 4 * key.size + 4096:  # dense: counting, no sort
        counts_all = np.bincount(key, minlength=space)
        present = np.flatnonzero(counts_all)
        if inverse:
            gid = np.full(space, -1, np.int64)
            gid[present] = np.arange(present.size)
            inv = gid[key]
        uniq, counts = present, counts_all[present]
    elif inverse:
        uniq, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
    else:
        uniq, counts = np.unique(key, return_counts=True)
    del key
    parts = []
    rest = uniq
    for size in reversed(sizes):
        parts.append(rest % size - 1)
        rest = rest // size
    parts.reverse()
    return inv, counts, parts


class GroupIndex:
    """Rows grouped by key, each group's rows in time order, as a (groups x longest) matrix.

    Order statistics then cost one small sort per row of the matrix instead of a
    sort of all rows per metric, and counter increases follow from the same order.
    Groups whose keys put one series' windows next to each other (window last,
    oldest first) make :meth:`time_order` the series' full time order.

    Row indices are held in 32 bits where they fit: a window's GPU and rank tables at
    100k GPUs are figured two at a time, and their index columns (millions of rows
    each) set the analyzer's peak memory.
    """

    def __init__(self, ts: np.ndarray, *keys: np.ndarray) -> None:
        rows = ts.size
        # (A dense matrix has at most 4 * rows + 4096 cells: its flat index fits too.)
        index = np.dtype(np.int32 if 4 * rows + 4096 <= _INT32.max else np.int64)
        inv, self.counts, self.keys = _groups(*keys)
        self.inv: np.ndarray = inv.astype(index, copy=False)
        del inv
        self.n = int(self.counts.size)
        self.width = int(self.counts.max()) if self.n else 0
        self.dense = self.n * self.width <= 4 * rows + 4096
        self._order: np.ndarray | None = None
        self._series: tuple[np.ndarray, np.ndarray] | None = None
        self._cell: np.ndarray | None = None
        self._grid: np.ndarray | None = None  # the matrix, used again metric after metric
        self.starts = np.cumsum(self.counts) - self.counts
        # Each row's place in the groups' time order (its group's start added), where the
        # matrix holds the groups; else the time order is sorted when first asked for.
        self._place: np.ndarray | None = None
        self._ts: np.ndarray | None = None
        if self.dense:
            first = self.starts.astype(index)
            # Each row's place in its group, in the order written.
            pos: np.ndarray = np.empty(rows, index)
            pos[np.argsort(self.inv, kind="stable")] = np.arange(rows, dtype=index) - np.repeat(
                first, self.counts
            )
            grid = self._grid = np.full((self.n, self.width), np.inf)
            grid[self.inv, pos] = ts
            pos = _in_time_order(grid, self.inv, pos)
            pos += first[self.inv]
            self._place = pos
        else:  # one group is huge (duplicated records, a broken agent, jobs of very unequal
            # sizes): quantiles sort globally instead, and need no time order
            self._ts = ts

    def time_order(self) -> np.ndarray:
        """Row indices sorted by group, then time (figured once: every counter needs it)."""
        if self._order is None:
            if self._place is None:
                assert self._ts is not None
                self._order = np.lexsort((self._ts, self.inv)).astype(self.inv.dtype)
            else:
                self._order = np.empty(self.inv.size, self._place.dtype)
                self._order[self._place] = np.arange(self.inv.size, dtype=self._place.dtype)
        return self._order

    def quantiles(self, values: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
        """The *qs* quantiles (lower element) of *values* per group, NaN left out."""
        if not self.dense:
            return group_quantiles(self.inv, self.n, values, qs)
        if self._cell is None:  # each row's place in the matrix, as one flat index
            assert self._place is not None  # (set wherever the matrix holds the groups)
            shift = np.arange(self.n) * self.width - self.starts
            self._cell = shift[self.inv]  # (64-bit: numpy indexes with nothing narrower)
            self._cell += self._place
        if self._grid is None:
            self._grid = np.empty((self.n, self.width))
        grid = self._grid
        grid.fill(np.nan)
        grid.ravel()[self._cell] = values  # (a flat index: half the time of a pair)
        valid = self.width - np.isnan(grid).sum(axis=1)
        grid.sort(axis=1)  # NaN last
        out = []
        rows = np.arange(self.n)
        for q in qs:
            idx = np.floor(q * np.maximum(valid - 1, 0)).astype(np.int64)
            out.append(np.where(valid > 0, grid[rows, idx], np.nan))
        return out

    def median(self, values: np.ndarray) -> np.ndarray:
        return self.quantiles(values, (0.5,))[0]

    def sum(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.inv, weights=values, minlength=self.n)

    def extremes(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group: the least and the largest of *values* (integers, or floats without
        NaN). One pass in the groups' order, where quantiles would sort every group."""
        if not self.n:
            return values[:0], values[:0]
        ordered = values[self.time_order()]
        return np.minimum.reduceat(ordered, self.starts), np.maximum.reduceat(ordered, self.starts)

    def first_last(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group: *values* at its first and its last row in time order."""
        if not self.n:
            return values[:0], values[:0]
        order = self.time_order()
        return values[order[self.starts]], values[order[self.starts + self.counts - 1]]

    def increase(self, series: np.ndarray, counter: np.ndarray) -> np.ndarray:
        """Per group: the counter's increase from one sample to the next of the same series.

        Missing values and resets (a decrease, e.g. after a reboot) count as zero.
        """
        order, same = self.time_order(), self._same_series(series)
        total = np.zeros(self.n)
        # Counters seldom move (some, bytes sent, every sample): the rows after a change are
        # looked at, a run of rows in time order at a time, so that no column of them all is
        # held. A step to or from a missing value is a change too, and does not count. (The
        # steps are whole numbers: summed run by run, they add up exactly.)
        for lo in range(0, counter.size - 1, CHUNK):
            rows = order[lo : lo + CHUNK + 1]
            c = counter[rows]
            at = np.flatnonzero(c[1:] != c[:-1])
            before, after = c[at], c[at + 1]
            step = after - before
            up = (step > 0) & (before != INT_MISSING) & (after != INT_MISSING) & same[lo + at]
            total += np.bincount(
                self.inv[rows[at[up] + 1]], weights=step[up].astype(np.float64), minlength=self.n
            )
        return total

    def _same_series(self, series: np.ndarray) -> np.ndarray:
        """Per row in time order but the last: whether the next is of the same series.

        Kept for the last *series*: a table's counters all share it.
        """
        if self._series is None or self._series[0] is not series:
            order = self.time_order()
            same = np.empty(max(order.size - 1, 0), bool)
            for lo in range(0, same.size, CHUNK):
                s = series[order[lo : lo + CHUNK + 1]]
                np.equal(s[1:], s[:-1], out=same[lo : lo + s.size - 1])
            self._series = (series, same)
        return self._series[1]


def _in_time_order(grid: np.ndarray, inv: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Each row's place in its group's time order, from its place in the order written
    (*pos*, changed in place) and the groups' times (*grid*, padded with inf: last).

    Agents append in time order, so only the few groups written out of order (a rank
    whose clock is behind its job's, a step placed again) are sorted: sorting every
    group of a 100k-rank window costs a second a pass.
    """
    late = np.flatnonzero((grid[:, 1:] < grid[:, :-1]).any(axis=1))
    if not late.size:
        return pos
    width = grid.shape[1]
    by_time = np.argsort(grid[late], axis=1, kind="stable")
    slot = np.empty_like(by_time)
    slot[np.arange(late.size)[:, None], by_time] = np.arange(width)[None, :]
    which = np.full(grid.shape[0], -1, np.int64)
    which[late] = np.arange(late.size)
    moved = np.flatnonzero(which[inv] >= 0)
    pos[moved] = slot[which[inv[moved]], pos[moved]]
    return pos


@dataclass(frozen=True)
class Rows:
    """The records a table sums: where *keep*, and each one's window counted from the oldest
    (``wrev``: the tables' groups then put one series' windows in time order)."""

    keep: np.ndarray
    wrev: np.ndarray
    n_windows: int

    @classmethod
    def of(cls, win: np.ndarray, n_windows: int) -> Rows:
        """The records in any of *n_windows* windows (*win*: each record's, -1 outside)."""
        keep = win >= 0
        return cls(keep, n_windows - 1 - win[keep], n_windows)

    @classmethod
    def window(cls, win: np.ndarray, w: int) -> Rows:
        """The records in window *w* alone, as the one window of their table."""
        keep = win == w
        return cls(keep, np.zeros(int(np.count_nonzero(keep)), np.int8), 1)  # (as Rows.of's)

    def w(self, wrev: np.ndarray) -> np.ndarray:
        return self.n_windows - 1 - wrev


def _rows(cols: Columns, keep: np.ndarray) -> Columns:
    """The rows of *cols* where *keep*: views, no copy, when they are one run of rows (every
    row, or a window of records kept in the order of their minutes), else copies. Packed
    columns (kept from pass to pass) stay packed until a table reads them."""
    which: slice | np.ndarray = keep
    if keep.size:
        lo, hi = int(np.argmax(keep)), keep.size - int(np.argmax(keep[::-1]))
        if keep[lo] and np.count_nonzero(keep) == hi - lo:
            which = slice(lo, hi)
    if isinstance(cols, PackedColumns):
        return cols.rows(which)
    return {name: col[which] for name, col in cols.items()}


def _node_jobs(frame: Frame, steps: Rows, gpus: Rows) -> np.ndarray:
    """The job each node ran in each window (most step records), or -1.

    A node without step records in a window takes the job most of its GPU records name
    there: a source that labels GPUs with their job (dcgm-exporter's ``hpc_job``) gives
    peer groups without the probe.
    """
    out = _most_records(frame, _rows(_named(frame.cols["step"]), steps.keep), steps)
    gpu = frame.cols["gpu"]
    if "job" in gpu:
        c = _rows(_named(gpu), gpus.keep)
        named = c["job"] >= 0
        if named.any():
            labelled = _rows(c, named)
            by_gpus = _most_records(frame, labelled, Rows(named, gpus.wrev[named], gpus.n_windows))
            out = np.where(out >= 0, out, by_gpus)
    return out


def _picked(cols: Columns, name: str, keep: np.ndarray) -> np.ndarray:
    """``cols[name][keep]``, unpacking only the rows picked from packed columns."""
    return cols.pick(name, keep) if isinstance(cols, PackedColumns) else cols[name][keep]


def _named(cols: Columns) -> dict[str, np.ndarray]:
    return {"node": cols["node"], "job": cols["job"]}


def _most_records(frame: Frame, cols: Columns, rows: Rows) -> np.ndarray:
    """Per (window, node), the job most of *cols* (the records of *rows*) name, or -1."""
    out = np.full((rows.n_windows, len(frame.nodes)), NO_PEER, np.int64)
    if not rows.wrev.size:
        return out
    _, cnt, (w, node, job) = _groups(rows.w(rows.wrev), cols["node"], cols["job"], inverse=False)
    # The most frequent job is written last and wins; a tie goes to the later job name, so
    # that the choice does not depend on the order in which the files were read.
    by_name = np.argsort(np.argsort(np.array(frame.jobs, dtype=object), kind="stable"))
    order = np.lexsort((by_name[job], cnt))
    out[w[order], node[order]] = job[order]
    return out


def _peer_of(
    node_job: np.ndarray,
    w: np.ndarray,
    node: np.ndarray,
    min_peers: int,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """Peer group per row: its node's job in that window when big enough, else NO_PEER."""
    job = node_job[w, node]
    # A window range with no rows at all (a report period before the first sample) has no
    # jobs either: every key is then "no peer".
    stride = int(node_job.max()) + 2 if node_job.size else 1
    key = w * stride + job + 1
    uniq, inv = np.unique(key, return_inverse=True)
    size = (
        group_count(inv, uniq.size)
        if weight is None
        else np.bincount(inv, weights=weight, minlength=uniq.size)
    )
    job = np.where((job >= 0) & (size[inv] >= min_peers), job, NO_PEER)
    # windows are compared separately: fold the window into the peer key
    return w * stride + job + 1


GPU_COUNTERS = ("ecc_sbe_volatile", "ecc_dbe_volatile", "pcie_replay", "nvlink_crc_errors")
NIC_COUNTERS = (
    "symbol_errors",
    "link_error_recovery",
    "link_downed",
    "rcv_errors",
    "xmit_wait",
    "xmit_bytes",
)
# A table's counter columns also carry each group's first and last value under these names,
# until the windows are put together (a window's increase then takes in the step from the
# window before: see _join_counters).
FIRST, LAST = ":first", ":last"


def _counters(
    t: Table, gi: GroupIndex, series: np.ndarray, c: Columns, names: tuple[str, ...]
) -> None:
    for name in names:
        values = c[name]  # (read once: a packed column is unpacked as it is read)
        t[name] = gi.increase(series, values)
        t[name + FIRST], t[name + LAST] = gi.first_last(values)


def gpu_table(frame: Frame, rows: Rows, hw_xids: np.ndarray, low_q: float) -> Table:
    c = _rows(frame.cols["gpu"], rows.keep)
    index = c["gpu"]
    gi = GroupIndex(c["ts"], c["node"], index, rows.wrev)
    node, gpu, wrev = gi.keys
    t = Table({"w": rows.w(wrev), "node": node, "gpu": gpu, "n": gi.counts})
    t["clock_lo"], t["clock_med"] = gi.quantiles(c["sm_clock_mhz"], (low_q, 0.5))
    t["power_lo"], t["power_med"] = gi.quantiles(c["power_w"], (low_q, 0.5))
    t["temp_hi"], t["temp_med"] = gi.quantiles(c["temp_c"], (1 - low_q, 0.5))
    t["util_med"] = gi.median(c["util_pct"])
    t["power_limit"] = gi.median(c["power_limit_w"])
    reasons = c["clock_event_reasons"]
    # Only the samples with a hardware slowdown or an XID are summed: seldom many. (A
    # missing value, INT_MISSING, has none of the bits.)
    fault = reasons & FAULT_REASON_BITS
    slowed = np.flatnonzero(fault)
    fault, group = fault[slowed], gi.inv[slowed]
    t["fault_frac"] = np.bincount(group, minlength=gi.n) / gi.counts
    bits = np.zeros(gi.n, np.int64)
    for bit in (0x8, 0x20, 0x40, 0x80):
        bits |= np.where(np.bincount(group[(fault & bit) != 0], minlength=gi.n) > 0, bit, 0)
    t["fault_bits"] = bits
    xid = c["xid"]
    hw = np.isin(xid, hw_xids)
    t["xid_hw"] = np.bincount(gi.inv[hw], minlength=gi.n).astype(np.float64)
    last = np.full(gi.n, -1, np.int64)
    np.maximum.at(last, gi.inv[hw], xid[hw])
    t["xid"] = last
    del xid, hw
    _counters(t, gi, c["node"].astype(np.int64) * 4096 + index, c, GPU_COUNTERS)
    return t


def host_table(frame: Frame, rows: Rows, low_q: float) -> Table:
    c = _rows(frame.cols["host"], rows.keep)
    gi = GroupIndex(c["ts"], c["node"], rows.wrev)
    node, wrev = gi.keys
    t = Table({"w": rows.w(wrev), "node": node, "n": gi.counts})
    t["load_hi"], t["load_med"] = gi.quantiles(c["load1"], (1 - low_q, 0.5))
    t["cpu_hi"], t["cpu_med"] = gi.quantiles(c["cpu_pct"], (1 - low_q, 0.5))
    return t


def nic_table(frame: Frame, rows: Rows, low_q: float) -> Table:
    c = _rows(frame.cols["nic"], rows.keep)
    gi = GroupIndex(c["ts"], c["node"], c["port"], rows.wrev)
    node, port, wrev = gi.keys
    t = Table({"w": rows.w(wrev), "node": node, "port": port, "n": gi.counts})
    t["rate_lo"], t["rate_med"] = gi.quantiles(c["rate_gbps"], (low_q, 0.5))
    active = np.array(["ACTIVE" in s.upper() for s in frame.states] + [True], bool)
    state = c["state"]
    down = ~active[np.where(state >= 0, state, len(frame.states))]
    t["down_frac"] = gi.sum(down.astype(np.float64)) / gi.counts
    series = c["node"].astype(np.int64) * (len(frame.ports) + 1) + c["port"]
    _counters(t, gi, series, c, NIC_COUNTERS)
    return t


def rank_table(frame: Frame, rows: Rows, low_q: float) -> Table:
    """Per (job, rank, window): the rank's step figures (its peers are given later)."""
    c = _rows(frame.cols["step"], rows.keep)
    gi = GroupIndex(c["ts"], c["job"], c["rank"], rows.wrev)
    job, rank, wrev = gi.keys
    w = rows.w(wrev)
    # a rank lives on one node; a rank seen on two (restarted elsewhere) keeps the newer one
    node = np.zeros(gi.n, np.int64)
    if gi.n:
        order = gi.time_order()
        node[gi.inv[order]] = c["node"][order]  # the last write per group wins: the newest
    t = Table({"w": w, "job": job, "node": node, "rank": rank, "n": gi.counts})
    compute = c["compute_s"]  # (read once: a packed column is unpacked as it is read)
    t["compute_hi"], t["compute_med"] = gi.quantiles(compute, (1 - low_q, 0.5))
    # Busy time per sample where the records say how much work a step was (per-step data
    # sharding gives ranks different shares: a rebalanced straggler's compute_s is normal).
    # A step without work (a zero share) says nothing about speed.
    samples = c["samples"]
    counted = samples != INT_MISSING
    t["per_sample"] = np.bincount(gi.inv[~counted], minlength=gi.n) == 0  # every step counted
    per = np.full(samples.size, np.nan)
    np.divide(compute, samples, out=per, where=counted & (samples > 0))
    per_hi = gi.quantiles(per, (1 - low_q,))[0]
    del per, compute
    t["busy_hi"] = np.where(t["per_sample"], per_hi, t["compute_hi"])
    # The rank's parallel role, -1 where not known: its pipeline stage, tensor-parallel
    # rank (its place within the stage) and data-parallel rank (its replica).
    # (A missing value is int64's least: a group's largest is missing only where all are.)
    for name, column in (("stage", "pp_stage"), ("tp", "tp_rank"), ("dp", "dp_rank")):
        least, largest = gi.extremes(c[column].astype(np.int64, copy=False))
        t[name] = np.where(least == INT_MISSING, np.maximum(largest, -1), largest)
    t["comm_med"] = gi.median(c["comm_s"])
    t["step_med"] = gi.median(c["step_s"])
    # local rank on the node (ranks in order) stands for the GPU index, as LOCAL_RANK does
    g = gi.n
    order = np.lexsort((rank, node, job, w))
    local = np.zeros(g, np.int64)
    if g:
        first = np.ones(g, bool)
        sw, sj, sn = w[order], job[order], node[order]
        first[1:] = (sw[1:] != sw[:-1]) | (sj[1:] != sj[:-1]) | (sn[1:] != sn[:-1])
        starts = np.maximum.accumulate(np.where(first, np.arange(g), 0))
        local[order] = np.arange(g) - starts
    t["local"] = local
    return t


def _ids(*keys: np.ndarray) -> np.ndarray:
    """One group number per row for the rows' combination of integer *keys*."""
    return _groups(*(k.astype(np.int64) for k in keys))[0]


def _role_peers(t: Table, min_peers: int) -> np.ndarray:
    """Peer group per rank row: the ranks of its job and window that do the same work.

    The data-parallel replicas of one place in the model (same pipeline stage, same
    tensor-parallel rank) do identical work: they are the peers when there are
    *min_peers* of them. With fewer replicas, the ranks of the whole stage are (tensor
    parallelism splits each layer evenly). A stage is never compared with another
    (stages differ by construction), nor busy time per sample with busy time per step.
    Rows without enough peers either way get ``-1 - window`` (not judged).
    """
    stage = _ids(t["w"], t["job"], t["stage"], t["per_sample"])
    place = _ids(stage, t["tp"])
    place_n = np.bincount(place)[place] if place.size else place
    stage_n = np.bincount(stage)[stage] if stage.size else stage
    first = int(place.max(initial=-1)) + 1
    return np.where(
        place_n >= min_peers, place, np.where(stage_n >= min_peers, first + stage, -1 - t["w"])
    )


@dataclass(frozen=True)
class History:
    """Where the ranks' own history lies: the *windows* step-record windows before the
    judged ones (``[analyze] own_history``), and what a window needs to count."""

    windows: int
    min_samples: int
    low_q: float


def own_reference(t: Table, old: Table, min_samples: int) -> None:
    """Give each rank row of *t* its own reference, for ranks too few peers can judge.

    *old*: the rank rows (:func:`rank_table`) of the history windows, at least those of
    the jobs with such ranks. ``own_ref`` is the lowest busy time (same unit) the rank
    had in its job in the history windows with at least *min_samples* steps (NaN
    without one), what the rank can do; ``own_windows`` how many windows it rests on.
    """
    t["own_ref"] = np.full(len(t), np.nan)
    t["own_windows"] = np.zeros(len(t), np.int64)
    if not len(old) or not len(t):
        return
    counted = (old["n"] >= min_samples) & np.isfinite(old["busy_hi"])
    both = [np.concatenate((old[k][counted], t[k])) for k in ("job", "rank", "per_sample")]
    who = _ids(*both)
    before, now = who[: int(counted.sum())], who[int(counted.sum()) :]
    best = np.full(int(who.max(initial=-1)) + 1, np.inf)
    np.minimum.at(best, before, old["busy_hi"][counted])
    t["own_ref"] = np.where(np.isfinite(best[now]), best[now], np.nan)
    t["own_windows"] = np.bincount(before, minlength=best.size)[now]


# What a history window keeps of its rank table for later passes' own references (a rank's
# busy time) and for judging a job's pace against its own (its ranks' step times).
HISTORY_COLS = ("job", "rank", "per_sample", "n", "busy_hi", "step_med")


def history_rows(
    t: Table,
    frame: Frame,
    ends: np.ndarray,
    at: float,
    window_s: float,
    n_windows: int,
    history: History,
    parts: Parts | None = None,
) -> Table:
    """The rank rows of the *history* windows before the *n_windows* ending at *at*, for
    the jobs of *t*'s ranks without peers (the rows :func:`own_reference` reads).

    Without *parts*, only those jobs' step records are read: a big job's history costs
    nothing. With *parts* (a caller that keeps windows from pass to pass and lets go of
    the step records behind the judged windows), each history window keeps its rows of
    every job there (:attr:`WindowPart.history`; the jobs short of peers may be others
    by then), taken from its rank table of the passes that judged it, or figured from
    the records where a record joined or left it since.
    """
    small = np.unique(t["job"][t["peer"] < 0]) if len(t) else t["job"]
    longer = n_windows + history.windows
    if parts is None:
        if not history.windows or not small.size:
            return Table({})
        win = assign_windows(ends, at, window_s, longer)
        win = np.where((win >= n_windows) & np.isin(frame.cols["step"]["job"], small), win, -1)
        return rank_table(frame, Rows.of(win, longer), history.low_q)
    keys = [(at - w * window_s, window_s) for w in range(n_windows, longer)]
    mine = [parts.setdefault(key, WindowPart()) for key in keys]
    for part in mine:
        if part.history is None and "rank" in part.tables:
            part.history = _history_of(part.tables["rank"])
    missing = [key for key, part in zip(keys, mine, strict=True) if part.history is None]
    figure_history(frame, ends, missing, history.low_q, parts)
    rows = [p.history for p in mine if p.history is not None and len(p.history)]
    if not rows or not small.size:
        return Table({})
    old = Table({k: np.concatenate([r[k] for r in rows]) for k in HISTORY_COLS})
    keep = np.isin(old["job"], small)
    return Table({k: v[keep] for k, v in old.cols.items()})


def job_steps(t: Table, min_samples: int) -> Table:
    """Per (window, job) of rank rows *t* (``w``, ``job``, ``n``, ``step_med``): the job's step
    time, the median of its ranks' median step times (ranks with at least *min_samples*
    steps there), and how many ranks that is. Ranks wait for each other every step, so their
    step times agree; the median keeps a rank cut short by a window's edge out of it."""
    if not len(t):
        return Table({k: np.empty(0, d) for k, d in _JOB_STEPS})
    counted = np.flatnonzero(t["n"] >= min_samples)
    inv, ranks, (w, job) = _groups(t["w"][counted], t["job"][counted].astype(np.int64))
    step = group_median(inv, int(ranks.size), t["step_med"][counted].astype(np.float64))
    return Table({"w": w, "job": job, "step": step, "ranks": ranks})


_JOB_STEPS = (("w", np.int64), ("job", np.int64), ("step", np.float64), ("ranks", np.int64))


def history_steps(
    frame: Frame,
    ends: np.ndarray,
    at: float,
    window_s: float,
    n_windows: int,
    history: History,
    parts: Parts | None = None,
) -> Table:
    """:func:`job_steps` of every job in the *history* windows before the *n_windows* ending
    at *at*: from the step records, or with *parts* from each window's kept rank rows
    (:func:`history_rows` has given every one of them its rows)."""
    pieces = []
    if parts is None and history.windows:
        win = assign_windows(ends, at, window_s, n_windows + history.windows)
    for w in range(n_windows, n_windows + history.windows):
        if parts is not None:
            part = parts.get((at - w * window_s, window_s))
            kept = part.history if part is not None else None
        else:  # a window at a time: its groups' index, not three windows', is held at once
            kept = _step_medians(frame, Rows.window(win, w))
        if kept is not None and len(kept):
            pieces.append(Table({**kept.cols, "w": np.full(len(kept), w, np.int64)}))
    cols = ("w", "job", "n", "step_med")
    joined = {k: np.concatenate([p[k] for p in pieces]) for k in cols} if pieces else {}
    return job_steps(Table(joined), history.min_samples)


def _step_medians(frame: Frame, rows: Rows) -> Table:
    """Per (job, rank) of one window's step records (*rows*): its steps and its median step
    time, as :func:`rank_table` figures them (and nothing else it figures: only the three
    columns are picked, a third of the time of taking the records whole)."""
    c = frame.cols["step"]
    job, rank, step = (_picked(c, name, rows.keep) for name in ("job", "rank", "step_s"))
    inv, counts, (job, _) = _groups(job, rank)
    return Table({"job": job, "n": counts, "step_med": group_median(inv, counts.size, step)})


def figure_history(
    frame: Frame,
    ends: np.ndarray,
    windows: Sequence[tuple[float, float]],
    low_q: float,
    parts: Parts,
) -> None:
    """Give each of *windows* (end, length) its rank rows as history in *parts*, from the
    step records (*ends*: their :func:`step_times`), as :func:`history_rows` figures them."""
    for end, length in windows:
        where = assign_windows(ends, end, length, 1)
        rows = rank_table(frame, Rows.window(where, 0), low_q)
        parts.setdefault((end, length), WindowPart()).history = _history_of(rows)


def figure_windows(
    frame: Frame,
    ends: np.ndarray,
    windows: Sequence[tuple[float, float]],
    hw_xids: tuple[int, ...],
    low_q: float,
    parts: Parts,
    threads: int = 1,
) -> None:
    """Give each of *windows* (end, length) its tables and jobs in *parts*, as a pass that
    judges it figures them (*ends*: the step records' :func:`step_times`), with *threads*
    threads."""
    if not windows:
        return
    xids = np.array(hw_xids, np.int64)
    with ThreadPoolExecutor(threads) as pool:
        for end, length in windows:
            wins, counts = _assigned(frame, ends, end, length, 1)
            part = parts.setdefault((end, length), WindowPart())
            _figure(frame, wins, [part], counts, xids, low_q, pool)


def _assigned(
    frame: Frame, ends: np.ndarray, at: float, window_s: float, n_windows: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each record's window of the *n_windows* ending at *at*, per table's kind (a step by
    its time *ends*), and each window's count of them.

    A kept table is figured again when its window holds another number of records than it
    was made of (the caller forgets those whose records changed; this catches a record that
    an end a little different put on the other side of an edge).
    """
    wins = {
        kind: assign_windows(frame.cols[kind]["ts"], at, window_s, n_windows)
        for kind in ("gpu", "host", "nic")
    }
    wins["step"] = assign_windows(ends, at, window_s, n_windows)
    counts = {
        kind: np.array([np.count_nonzero(win == w) for w in range(n_windows)])
        for kind, win in wins.items()
    }
    return wins, counts


def _history_of(t: Table) -> Table:
    """What a window keeps of its rank table *t* as history (its records may be let go)."""
    return Table({k: t[k] for k in HISTORY_COLS})


def _interval(frame: Frame, wins: dict[str, np.ndarray]) -> float:
    """The agents' sampling interval: median gap between a node's host (or GPU) samples.

    Taken from the samples in the windows, whatever order the files were read in, so
    that a pass that keeps its records from pass to pass finds the same figure.
    """
    for kind, extra in (("host", None), ("gpu", "gpu")):
        c = frame.cols[kind]
        keep = wins[kind] >= 0
        if int(np.count_nonzero(keep)) < 2:
            continue
        ts = c["ts"][keep]
        series = c["node"][keep].astype(np.int64) * 4096 + (_picked(c, extra, keep) if extra else 0)
        # Agents write each series in time order, and the windows' records lie minute after
        # minute: a stable sort by series alone (runs to merge) is mostly the time order too,
        # and a sort by time within each series is only needed where it is not.
        gaps = _gaps(ts, series, np.argsort(series, kind="stable"))
        if np.any(gaps < 0):
            gaps = _gaps(ts, series, np.lexsort((ts, series)))
        gaps = gaps[gaps > 0]
        if gaps.size:
            return float(np.median(gaps))
    return 0.0


def _gaps(ts: np.ndarray, series: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The time from each record to the next of its series, the records taken in *order*."""
    ordered = series[order]
    return np.diff(ts[order])[ordered[1:] == ordered[:-1]]


def coverage(
    tables: dict[str, Table],
    shape: tuple[int, int],
    interval: float,
    window_s: float,
    min_samples: int,
    min_coverage: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(has_data, seen) per window and node.

    A node has data when its agent's samples (per GPU / port: the average)
    cover enough of the window, or, for a node that only reports steps, when
    each of its ranks has enough steps.
    """
    size = shape[0] * shape[1]
    samples = np.zeros(size)
    seen = np.zeros(size, bool)
    for kind in ("host", "gpu", "nic"):
        t = tables[kind]
        if not len(t):
            continue
        cell = t["w"] * shape[1] + t["node"]
        total = np.bincount(cell, weights=t["n"].astype(np.float64), minlength=size)
        items = np.bincount(cell, minlength=size)
        samples = np.maximum(samples, total / np.maximum(items, 1))
        seen |= items > 0
    expected = window_s / interval if interval > 0 else float(min_samples)
    agent_ok = (samples >= min_samples) & (samples >= min_coverage * expected)
    step_ok = np.zeros(size, bool)
    t = tables["rank"]
    if len(t):
        cell = t["w"] * shape[1] + t["node"]
        least = np.full(size, np.inf)
        np.minimum.at(least, cell, t["n"].astype(np.float64))
        step_ok = least >= min_samples
        seen |= np.isfinite(least)
    has = np.where(samples > 0, agent_ok, step_ok)
    return has.reshape(shape), seen.reshape(shape)


def step_times(frame: Frame, threads: int = 1) -> np.ndarray:
    """Per step record: the median time at which its job's ranks ended that step.

    Ranks end a step together; using their common time keeps one node's clock
    skew from putting its steps in a different window than its peers'.
    """
    c = frame.cols["step"]
    return step_ends(c["ts"], c["job"], c["step"], threads)


# Fewer step records than this are placed in one thread (a thread's start and the split
# cost more than they save).
_SPLIT_ROWS = 1 << 20


def step_ends(ts: np.ndarray, job: np.ndarray, step: np.ndarray, threads: int = 1) -> np.ndarray:
    """:func:`step_times` of the records given as columns: whole (job, step) groups give
    their groups' figures whatever other records there are. With *threads*, the jobs are
    shared out among them: placing every step record a cold pass reads is a sort of them
    all, which would keep one core busy and leave the others idle."""
    if threads < 2 or ts.size < _SPLIT_ROWS:
        return _step_ends(ts, job, step)
    share = _shares(job, threads)
    out = np.empty(ts.size)

    def place(k: int) -> None:
        rows = np.flatnonzero(share == k)
        out[rows] = _step_ends(ts[rows], job[rows], step[rows])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(place, range(threads)))
    return out


def _shares(job: np.ndarray, threads: int) -> np.ndarray:
    """Per record, which of *threads* places it: whole jobs, the largest first to the
    least loaded (one job may hold most of the records)."""
    sizes = np.bincount(job + 1)  # (-1: a record of no job, a group of its own)
    load = [0] * threads
    owner = np.zeros(sizes.size, np.int32)
    for j in np.argsort(sizes)[::-1].tolist():
        if not sizes[j]:
            break
        k = load.index(min(load))
        owner[j] = k
        load[k] += int(sizes[j])
    return owner[job + 1]


# A job with at least this many step records has them placed on their own: one job's ranks
# log the same steps, so its records fill a (steps x ranks) matrix, sorted a row at a time,
# where the records of jobs of unequal sizes together fill none and are sorted all at once
# (over twice the time). Smaller jobs are placed together: a call per job would cost more.
_OWN_JOB_ROWS = 1 << 12


def _step_ends(ts: np.ndarray, job: np.ndarray, step: np.ndarray) -> np.ndarray:
    if not ts.size:
        return ts
    by_job = np.argsort(job, kind="stable")
    out = np.empty(ts.size)
    small = []
    for rows in np.split(by_job, np.flatnonzero(np.diff(job[by_job])) + 1):
        if rows.size >= _OWN_JOB_ROWS:
            out[rows] = _placed(ts[rows], job[rows], step[rows])
        else:
            small.append(rows)
    if small:
        rows = np.concatenate(small)
        out[rows] = _placed(ts[rows], job[rows], step[rows])
    return out


def _placed(ts: np.ndarray, job: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Each record's (job, step) group's median time."""
    gi = GroupIndex(ts, job, step - int(step.min()))
    return gi.median(ts)[gi.inv]


@dataclass
class WindowPart:
    """One window's figures before peers are given, and what they were made of.

    A later pass that judges the same window (same end, same length) takes each table
    whose records did not change as it is (:func:`extract_again`).
    """

    tables: dict[str, Table] = field(default_factory=dict)  # gpu, host, nic, rank (w = 0)
    records: dict[str, int] = field(default_factory=dict)  # per table: its records then
    node_job: np.ndarray | None = None  # per node: the job it ran in the window, or NO_PEER
    # its rank rows as the ranks' own history (HISTORY_COLS), once a pass needed them so
    history: Table | None = None
    # the jobs whose rank rows are stale in a rank table otherwise kept (see drop)
    stale: set[int] = field(default_factory=set)

    def drop(self, kind: str, jobs: np.ndarray | None = None) -> None:
        """Forget what records of *kind* make (their window's records changed; the jobs
        go with the rank and GPU tables, see _figure).

        *jobs*: the step records that changed are these jobs' only. The rank table is a
        row per (job, rank), each made of its own job's records: only those jobs' rows
        are stale, and figured again (a step record placed late, its job's ranks
        straddling a minute, stales one job's rows, not a window of 3 million records)."""
        if kind == "step":
            self.history = None
            if jobs is not None and "rank" in self.tables:
                self.stale.update(np.unique(jobs).tolist())
                return
            self.stale.clear()
        for name, (of, _) in TABLES.items():
            if of == kind:
                self.tables.pop(name, None)

    def keep_history_only(self) -> None:
        """Keep only the window's rank rows as history: no pass judges it again (one that
        does figures its tables afresh), a later one may read it as history (not rows
        some of which are stale: those are figured again from the records)."""
        if self.history is None and "rank" in self.tables and not self.stale:
            self.history = _history_of(self.tables["rank"])
        self.tables.clear()
        self.records.clear()
        self.stale.clear()
        self.node_job = None


# Per table: the records it sums and the keys of its groups (a window last).
TABLES = {
    "gpu": ("gpu", ("node", "gpu")),
    "host": ("host", ("node",)),
    "nic": ("nic", ("node", "port")),
    "rank": ("step", ("job", "rank")),
}
Parts = MutableMapping[tuple[float, float], WindowPart]  # by (window end, window length)


def _figure(
    frame: Frame,
    wins: dict[str, np.ndarray],
    parts: list[WindowPart],
    counts: dict[str, np.ndarray],
    hw_xids: np.ndarray,
    low_q: float,
    pool: ThreadPoolExecutor,
) -> None:
    """Give each window's part (newest first) the tables its records no longer match, and
    its jobs where its step or GPU tables are figured again (GPU records may name jobs)."""
    todo = [
        (w, name)
        for w, part in enumerate(parts)
        for name, (kind, _) in TABLES.items()
        if name not in part.tables
        or part.records[name] != counts[kind][w]
        or (name == "rank" and part.stale)
    ]
    todo.sort(key=lambda item: _LONGEST_FIRST.index(item[1]))
    # The tables only read the frame: several at a time, one a thread of the pool (numpy's
    # sorts and copies let go of the interpreter), the longest first.
    futures = {
        (w, name): pool.submit(
            _window_table,
            frame,
            name,
            wins[TABLES[name][0]],
            w,
            hw_xids,
            low_q,
            parts[w],
            int(counts[TABLES[name][0]][w]),
        )
        for w, name in todo
    }
    redo = {w for w, name in todo if name in ("rank", "gpu")}
    redo |= {w for w, part in enumerate(parts) if part.node_job is None}
    jobs = {w: pool.submit(_window_jobs, frame, wins, w) for w in sorted(redo)}
    for (w, name), future in futures.items():
        parts[w].tables[name] = future.result()
        parts[w].records[name] = int(counts[TABLES[name][0]][w])
        if name == "rank":
            parts[w].stale.clear()
    for w, job in jobs.items():
        parts[w].node_job = job.result()


_LONGEST_FIRST = ("rank", "gpu", "nic", "host")


def _narrowed(t: Table) -> Table:
    """*t* with each 64-bit integer column whose values all fit held in 32 bits.

    A window's tables are kept for the passes that judge it again (ten at 100k GPUs, one
    a minute: 430 MB), and most of their integer columns are keys, counts and counters
    that fit: they are widened back where windows are joined, so the tables joined are
    the same whether a window was kept or figured afresh.
    """
    cols, narrowed = dict(t.cols), set(t.narrowed)
    for name, col in t.cols.items():
        if col.dtype != np.int64 or not col.size:
            continue
        if _INT32.min <= col.min() and col.max() <= _INT32.max:
            cols[name] = col.astype(np.int32)
            narrowed.add(name)
    return Table(cols, frozenset(narrowed))


def _window_jobs(frame: Frame, wins: dict[str, np.ndarray], w: int) -> np.ndarray:
    return _node_jobs(frame, Rows.window(wins["step"], w), Rows.window(wins["gpu"], w))[0]


def _window_table(
    frame: Frame,
    name: str,
    win: np.ndarray,
    w: int,
    hw_xids: np.ndarray,
    low_q: float,
    part: WindowPart,
    records: int,
) -> Table:
    """Window *w*'s table *name* (narrowed, as kept), of its *records*; a rank table whose
    rows are stale for a few jobs only (*part*'s) gets theirs figured again."""
    rows = Rows.window(win, w)
    if name == "gpu":
        return _narrowed(gpu_table(frame, rows, hw_xids, low_q))
    if name == "host":
        return _narrowed(host_table(frame, rows, low_q))
    if name == "nic":
        return _narrowed(nic_table(frame, rows, low_q))
    old = part.tables.get("rank")
    if part.stale and old is not None:
        jobs = np.fromiter(part.stale, np.int64, len(part.stale))
        redone = _rank_rows_again(frame, rows, old, jobs, low_q)
        if int(redone["n"].sum()) == records:  # (else a record left or joined unseen)
            return redone
    return _narrowed(rank_table(frame, rows, low_q))


def _rank_rows_again(frame: Frame, rows: Rows, old: Table, jobs: np.ndarray, low_q: float) -> Table:
    """Rank table *old* (narrowed) of one window (*rows*) with the rows of *jobs* figured
    again from the window's records: what the whole table figured anew is. Its rows are
    one per (job, rank), in that order, each figured from its own job's records only (the
    local rank too: per job and node), and narrowing depends only on the values."""
    keep = rows.keep.copy()
    where = np.flatnonzero(keep)
    keep[where[~np.isin(_picked(frame.cols["step"], "job", keep), jobs)]] = False
    count = int(np.count_nonzero(keep))
    fresh = rank_table(frame, Rows(keep, np.zeros(count, np.int8), 1), low_q)
    stays = ~np.isin(old["job"], jobs)
    cols = {
        name: np.concatenate((old[name][stays].astype(fresh[name].dtype, copy=False), fresh[name]))
        for name in fresh.cols
    }
    order = np.lexsort((cols["rank"], cols["job"]))
    return _narrowed(Table({name: values[order] for name, values in cols.items()}))


def _join(
    parts: list[WindowPart], n_nodes: int, min_peers: int, min_rank_peers: int
) -> tuple[np.ndarray, dict[str, Table]]:
    """The windows' parts (newest first) as one set of tables, with their peers.

    Rows come in the order one table over every window gives (keys, then the oldest
    window first), and a counter's increase takes in the step from the series' last
    sample in the window before (a cold table counts it in the newer window).
    """
    node_job = np.full((len(parts), n_nodes), NO_PEER, np.int64)
    for w, part in enumerate(parts):
        assert part.node_job is not None
        node_job[w, : part.node_job.size] = part.node_job
    tables = {}
    for name, (_, keys) in TABLES.items():
        pieces = [(w, parts[w].tables[name]) for w in range(len(parts) - 1, -1, -1)]
        cols = {
            col: np.concatenate([t[col] for _, t in pieces], dtype=_joined_dtype(pieces, col))
            for col in pieces[0][1].cols
        }
        cols["w"] = np.concatenate([np.full(len(t), w, np.int64) for w, t in pieces])
        key, _, _ = _mixed_key(tuple(cols[k] for k in keys), offset=1)
        order = np.argsort(key, kind="stable")
        t = Table({col: values[order] for col, values in cols.items()})
        same = np.zeros(len(t), bool)
        same[1:] = key[order][1:] == key[order][:-1]
        _join_counters(t, same)
        tables[name] = t
    nic = tables["nic"]
    nic["errors"] = nic["symbol_errors"] + nic["link_error_recovery"] + nic["rcv_errors"]
    for name, least in (("gpu", min_peers), ("host", 3), ("nic", min_peers)):
        t = tables[name]
        t["peer"] = _peer_of(node_job, t["w"], t["node"], least)
    tables["rank"]["peer"] = _role_peers(tables["rank"], min_rank_peers)
    return node_job, tables


def _joined_dtype(pieces: list[tuple[int, Table]], col: str) -> np.dtype[Any] | None:
    """What joining the windows' *col* gives had none been narrowed (None: none was)."""
    if not any(col in t.narrowed for _, t in pieces):
        return None
    return np.result_type(*(np.int64 if col in t.narrowed else t[col].dtype for _, t in pieces))


def _join_counters(t: Table, same: np.ndarray) -> None:
    """Add to each counter's increase the step from the same series' row before (*same*)."""
    for name in [col[: -len(FIRST)] for col in t.cols if col.endswith(FIRST)]:
        first, last = t.cols.pop(name + FIRST), t.cols.pop(name + LAST)
        before = np.roll(last, 1)
        valid = same & (first != INT_MISSING) & (before != INT_MISSING)
        t[name] = t[name] + np.maximum(np.where(valid, first - np.where(valid, before, 0), 0), 0)


@dataclass
class Kept:
    """What a caller that judges the same windows pass after pass (the incremental analyzer)
    keeps from one pass to the next: the step records' :func:`step_times` (*ends*), each
    window's figures (*parts*, by window end and length) and, with *history*, the history
    windows' rank rows (:func:`history_rows`), for a caller that lets go of their records."""

    parts: Parts = field(default_factory=dict)
    ends: np.ndarray | None = None
    history: bool = False


def extract(frame: Frame, at: float, window_s: float, n_windows: int, **settings: Any) -> Features:
    """Compute every feature table for the *n_windows* windows ending at *at*, from *frame*
    alone; *settings*: :func:`extract_again`'s keywords.

    Step records of the *own_history* windows before those give each rank its own
    reference (:func:`own_reference`). With *job_paces*, each job's step time in the
    history windows too (:func:`history_steps`). *threads*: the threads that figure the
    tables (and the sampling interval beside them).
    """
    return extract_again(frame, at, window_s, n_windows, Kept(), **settings)


def extract_again(
    frame: Frame,
    at: float,
    window_s: float,
    n_windows: int,
    kept: Kept,
    *,
    min_samples: int,
    min_coverage: float,
    min_peers: int,
    low_q: float,
    hw_xids: tuple[int, ...],
    min_rank_peers: int = 3,
    own_history: int = 0,
    job_paces: bool = False,
    threads: int = 1,
) -> Features:
    """:func:`extract` for a caller that keeps what a pass figured (*kept*): a window in
    ``kept.parts`` whose records did not change is not figured again; a window not there,
    or whose records changed, is figured and added."""
    parts, keep_history = kept.parts, kept.history
    ends = step_times(frame, threads) if kept.ends is None else kept.ends
    wins, counts = _assigned(frame, ends, at, window_s, n_windows)
    mine = [parts.setdefault((at - w * window_s, window_s), WindowPart()) for w in range(n_windows)]
    history = History(own_history, min_samples, low_q)
    with ThreadPoolExecutor(threads) as pool:  # (the sampling interval beside the tables)
        interval = pool.submit(_interval, frame, wins)
        paces = None
        if job_paces and not keep_history:  # from the step records alone: beside them too
            paces = pool.submit(history_steps, frame, ends, at, window_s, n_windows, history)
        _figure(frame, wins, mine, counts, np.array(hw_xids, np.int64), low_q, pool)
    node_job, tables = _join(mine, len(frame.nodes), min_peers, min_rank_peers)
    old = history_rows(
        tables["rank"],
        frame,
        ends,
        at,
        window_s,
        n_windows,
        history,
        parts if keep_history else None,
    )
    own_reference(tables["rank"], old, min_samples)
    before = Table({})
    if paces is not None:
        before = paces.result()
    elif job_paces:  # from the kept windows' rank rows, which history_rows gave them
        before = history_steps(frame, ends, at, window_s, n_windows, history, parts)
    shape = (n_windows, len(frame.nodes))
    has_data, seen = coverage(tables, shape, interval.result(), window_s, min_samples, min_coverage)
    return Features(
        at=at,
        window_s=window_s,
        n_windows=n_windows,
        nodes=frame.nodes,
        jobs=frame.jobs,
        ports=frame.ports,
        gpu=tables["gpu"],
        host=tables["host"],
        nic=tables["nic"],
        rank=tables["rank"],
        has_data=has_data,
        seen=seen,
        node_job=node_job,
        history_steps=before,
    )
