"""The analyzer as a lasting object: each pass reads only what was written since the last one.

The mitigation controller judges the fleet every minute. A cold pass
(:func:`guardctl.analyze.engine.analyze`) lists the store, reads every column
mirror whole and parses whatever they do not cover: at 100k GPUs that is most
of its cost, and a minute later it does it all again for one more minute of
records. :class:`Analyzer` keeps, from pass to pass:

- per source file, how far it has read it (bytes of the JSON Lines file, rows of
  its column mirror, the mirror's string rows and its last mark row), so that a
  pass reads only the rows written since, with one read per file;
- the records of the segments a pass still needs, as growing numpy columns (with
  the segment each came from), each in a ring of its own (one memory file
  mapped twice, back to back: ``guardctl.analyze.ring``) fitted to the records
  and a pass more, so that the pages a pass lets go of are the ones the next
  pass writes (see ``_Columns``), in the order of their minutes (a window on
  the minute grid is then one run of records, which its tables read in place),
  and per segment the input counts and every node's newest timestamp (for where
  the newest window ends);
- each window's tables (``features.WindowPart``), taken as they are by a later
  pass that judges the same window when no record of theirs joined or left it
  (the controller daemon's windows end on a multiple of its interval, so a pass a
  minute apart meets two windows judged before);
- the column mirrors open, up to a quarter of the open-files limit;

and then judges those records with :func:`~guardctl.analyze.engine.judge`,
exactly as a cold pass judges its own. The result is what
``engine.analyze(path, settings, at)`` returns for the same files.

What it cannot carry over, it reads again: a file that shrank or was replaced
(another inode), a file deleted from a segment still in use, or a mirror rewritten
behind its last mark start the state over (a pass that reads everything, as a
cold pass does). Bytes a mirror does not cover yet (a batch being written) are
parsed for that pass only, as a cold pass parses them, and read from the mirror
once it has them; files without a usable mirror are parsed, tail by tail. A closed
segment none of whose files was read yet is read from its Parquet files, as a cold
pass reads it (its files' mirrors go once it can no longer grow).
Records older than the oldest window are let go (step records a window later,
because a step is placed by the median time of its job's ranks, whose clocks may
differ; and, off the minute grid, only before the ranks' own history, ``[analyze]
own_history``: on the grid each history window keeps instead its rank rows from
the passes that judged it, ``features.history_rows``); a pass asked for a time
before what is kept runs cold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import resource
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from guardctl.analyze.engine import (
    Analysis,
    ahead_of,
    analyze,
    cutoffs,
    default_at,
    feature_settings,
    history_needed,
    judge,
    needed_from,
    nothing_judged,
    steps_needed,
    until_now,
)
from guardctl.analyze.features import (
    CHUNK,
    Kept,
    Parts,
    WindowPart,
    extract_again,
    figure_history,
    figure_windows,
    step_ends,
)
from guardctl.analyze.frame import Columns, Frame
from guardctl.analyze.load import Listing, _Tail, parse_tails
from guardctl.analyze.mirrors import RowBuffer, decode, row_dtype
from guardctl.analyze.packing import PackedColumns, Packing, choose
from guardctl.analyze.ring import PAGE as _PAGE
from guardctl.analyze.ring import Ring
from guardctl.config import Settings
from guardctl.storage import layout, segments
from guardctl.telemetry import mirror, schema
from guardctl.telemetry.columns import TABLE_OF, TABLES

_ROW = row_dtype(mirror.WIDTH)
# New bytes (of the JSON Lines files) whose mirror rows are read and decoded at once, into
# one buffer that the next group and the next pass read into again: on a virtual machine,
# memory the process has not touched yet costs about as much as reading into it (the host
# backs it page by page), and a pass a minute at 100k GPUs reads some 300 MB of rows.
READ_BYTES = 64 << 20
# A buffer larger than this (one file's tail alone was larger) is not kept for later.
KEEP_BUFFER = 2 * READ_BYTES + (8 << 20)
# A mark row: its kind in byte 0, then behind the row's head four 64-bit slots: start, end,
# lines, checksum (see guardctl.telemetry.mirror). The end's and the checksum's places, in
# 8-byte words; a mark put in front of a tail has start 0 and no lines.
_MARK_END, _MARK_SUM = mirror.HEAD.size // 8 + 1, mirror.HEAD.size // 8 + 3
# A mirror's tail is read from its last mark read: byte _TAIL_FROM + rows consumed x WIDTH.
_TAIL_FROM = mirror.PREAMBLE_SIZE - mirror.WIDTH


_T = TypeVar("_T")
# What a pass counts of its reading (Analyzer.read): mirror rows decoded, JSON Lines bytes
# parsed, step records placed again, window tables taken from earlier passes, files whose
# mirror rows were decoded, and the agents' files it opened (mirrors not kept open from an
# earlier pass, JSON Lines parsed; a first pass's closed segments not counted).
_READ = (
    "mirror_rows",
    "parsed_bytes",
    "steps_placed",
    "tables_kept",
    "mirror_files",
    "files_opened",
)


class _Restart(Exception):
    """Something read earlier changed under the analyzer: start the state over."""


@dataclass(slots=True)  # (a hundred thousand of them at 100k GPUs: no dict each)
class _File:
    """How far one source file has been read into the kept records."""

    segment: int  # its segment's number (see Analyzer._segment_id)
    ino: int
    offset: int = 0  # bytes of the JSON Lines file whose records are kept
    mirror: bool = True  # read from its column mirror (else parsed)
    rows: int = 0  # mirror rows consumed, after the preamble
    strings: bytes = b""  # the mirror's string rows so far: its string tables
    strings_sum: int = 0  # their checksum, for the mark that stands for them
    mark: bytes = b""  # the last mark row consumed (a rewritten mirror differs)
    pending: bool = False  # parsed file: a last line still being written
    cols: str = ""  # its column mirror's path
    fd: int = -1  # the mirror, kept open from pass to pass (within the analyzer's budget)


@dataclass
class _Segment:
    """Counts of one segment's kept input, and each node's newest record in it."""

    records: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    newest: np.ndarray = field(default_factory=lambda: np.empty(0))


class _Names:
    """The kept records' string tables: append-only, so kept indices stay valid."""

    def __init__(self) -> None:
        self.lists: dict[str, list[str]] = {t: [] for t in TABLES}
        self.ids: dict[str, dict[str, int]] = {t: {} for t in TABLES}

    def lut(self, table: str, names: Sequence[str]) -> np.ndarray:
        """Kept index of each of *names* (appending new ones); index -1 maps to -1."""
        ids, out = self.ids[table], self.lists[table]
        idx = []
        for name in names:
            found = ids.get(name)
            if found is None:
                found = ids[name] = len(out)
                out.append(name)
            idx.append(found)
        return np.array([*idx, -1], np.int32)


_OWN = ("segment", "end")  # the kept columns' own, not the frame's
# Columns the pass reads as they are kept (times, keys, the kept columns' own), not packed:
# the others are read a window's rows at a time, by its tables (see features._rows).
_AS_READ = frozenset(("ts", "node", "job", "step", *_OWN))
_SAMPLE = 1 << 16  # values a packing is first chosen from
# A ring kept is at most this many passes' records longer than its records (see _Columns.fit).
_SPARE_PASSES = 3
_SMALLEST = 1 << 16  # records: rings smaller than this are not worth fitting
_COPY_ROWS = 1 << 14  # records appended at a time, every column (their rows stay in cache)


class _Column:
    """One kept column in a :class:`~guardctl.analyze.ring.Ring` of its own, packed
    (:mod:`guardctl.analyze.packing`) unless it is one the pass reads as it is kept.

    ``array`` has ``2 * room`` values, value ``i`` and ``i + room`` the same memory: any
    *room* values in a row from the first half are one array, however they wrap.
    """

    def __init__(self, dtype: np.dtype[Any], *, packs: bool) -> None:
        self.packing = Packing.plain(dtype)
        self.packs = packs  # (else the values are kept as the frame has them)
        self._ring: Ring | None = None
        self.array = np.empty(0, dtype)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.packing.stored

    def reserve(
        self, room: int, start: int, used: int, packing: Packing | None = None, *, at: int = 0
    ) -> None:
        """A ring of *room* values (a multiple of the page size), with the *used* values
        from *start* copied to *at* (packed anew with *packing*). The old ring goes with
        the last view of it."""
        old, self.packing = self.packing, packing or self.packing
        try:
            ring: Ring | None = Ring(room * self.dtype.itemsize)
            fresh = np.asarray(ring).view(self.dtype)
        except OSError:  # no ring here: plain memory twice as long, whose halves differ
            ring, fresh = None, np.zeros(2 * room, self.dtype)
        if used:
            values, into = self.array[start : start + used], fresh[at : at + used]
            if self.packing == old:
                into[...] = values
            elif not self.packing.put(into, old.unpack(values)):
                raise AssertionError("a packing chosen for these values took them")
        self._ring, self.array = ring, fresh

    def start_over(self, values: np.ndarray) -> bool:
        """Choose the packing from *values*, the first to be kept (no value is kept now);
        True when it changed (the column then has no room until it is reserved)."""
        if not self.packs:
            return False
        # From a sample: a value it did not see that does not fit packs the column anew.
        # (As the frame's type: packing never changes what a pass reads.)
        packing = choose(np.asarray(values[:: max(1, values.size // _SAMPLE)], self.packing.wide))
        if packing == self.packing:
            return False
        self.packing, self._ring, self.array = packing, None, np.empty(0, packing.stored)
        return True

    def put(self, at: int, values: np.ndarray, kept: int) -> None:
        """Write *values* at *at*, packed; when one does not fit, the column is packed anew
        for them and the *kept* values before *at*, which stay where they are."""
        values = np.asarray(values, self.packing.wide)  # (a copy only where a writer's differs)
        if self.packing.put(self.array[at : at + values.size], values):
            return
        start = at - kept
        held = self.packing.unpack(self.array[start:at])
        packing = choose(np.concatenate((held, values)))
        del held
        self.reserve(self.array.size // 2, start, kept, packing, at=start)
        if not self.packing.put(self.array[at : at + values.size], values):
            raise AssertionError("a packing chosen for these values took them")

    def ready(self, lo: int, hi: int) -> None:
        """Values *lo* to *hi* are about to be written (see Ring.ready)."""
        if self._ring is not None:
            size = self.dtype.itemsize
            self._ring.ready(lo * size, hi * size)

    def release(self, lo: int, hi: int, *, keep: bool) -> None:
        """Let go of the whole pages of values *lo* to *hi* (no longer in use): kept for
        the values written next (*keep*), or given back."""
        if self._ring is not None:
            size = self.dtype.itemsize
            self._ring.let_go(lo * size, hi * size, keep=keep)

    def to_first_half(self, start: int, count: int) -> None:
        """The *count* values from *start* (in the second half) are read from the first half
        from now on: in a ring, the same memory, whose second half is unmapped so that no
        page is mapped (and counted) twice; in plain memory, they move there (the room is
        at least *count*: no overlap)."""
        room = self.array.size // 2
        if self._ring is not None:
            self._ring.unmap(self._ring.size, 2 * self._ring.size)
        else:
            self.array[start - room : start - room + count] = self.array[start : start + count]

    def held(self) -> int:
        return self._ring.held() if self._ring is not None else 0


class _Columns:
    """One kind's kept records: numpy columns in rings, and each record's segment.

    The records are values ``start`` to ``start + n`` of each column (``start`` within
    the ring's first half): letting go of the oldest (a pass a minute lets go of a
    minute) moves only the few kept among them, and the pages before ``start`` are the
    ones the next records are written into, once the ring fits (:meth:`fit`).
    """

    def __init__(self, kind: str) -> None:
        dtypes = {name: col.dtype for name, col in Frame().cols[kind].items()}
        dtypes["segment"] = np.dtype(np.uint8)  # its segment's tag (see _tag)
        if kind == "step":  # each step's time as its job's ranks ended it, kept between passes
            dtypes["end"] = np.dtype(np.float64)
        self._cols = {
            name: _Column(dtype, packs=name not in _AS_READ) for name, dtype in dtypes.items()
        }
        self.start = 0
        self.n = 0
        self.placed = 0  # the first records whose "end" is their group's, as of the last pass
        self.added = 0  # records appended since the last fit: a pass's worth
        self._fitted = 0  # records at the last fit
        self._pass = 0  # records the last pass added (0: no pass yet)

    @property
    def room(self) -> int:
        return self._cols["ts"].array.size // 2

    @property
    def data(self) -> dict[str, np.ndarray]:
        """Each column from the first record kept (its room to grow after the nth)."""
        lo, hi = self.start, self.start + self.room
        return {name: col.array[lo:hi] for name, col in self._cols.items()}

    def append(self, cols: dict[str, np.ndarray]) -> None:
        m = int(cols["ts"].size)
        if not m:
            return
        if not self.n:  # (every column is asked: a list, not a generator)
            chosen = [self._cols[name].start_over(values) for name, values in cols.items()]
            if any(chosen):  # every column in a ring of the same room
                self._move(max(self.room, 2 * m))
        if self.n + m > self.room:  # twice what is needed: a first pass grows group by group
            self._move(2 * (self.n + m))
        end = self.start + self.n
        for name in cols:
            self._cols[name].ready(end, end + m)
        # Decoded columns are strided views of their rows (see mirrors._columns): copied
        # a run of rows at a time, every column, the rows are read from memory once, not
        # once per column (at 100k GPUs, 0.35 s a pass against 0.1).
        for lo in range(0, m, _COPY_ROWS):
            hi = min(m, lo + _COPY_ROWS)
            for name, values in cols.items():
                self._cols[name].put(end + lo, values[lo:hi], self.n + lo)
        self.n += m
        self.added += m

    def _move(self, room: int) -> None:
        room = -(-max(room, _SMALLEST) // _PAGE) * _PAGE
        for col in self._cols.values():
            col.reserve(room, self.start, self.n)
        self.start = 0

    @property
    def fitted(self) -> bool:
        """Whether a pass with records of this kind has fitted the ring (or tried to)."""
        return bool(self._fitted)

    def fit(self, per_pass: int = 0) -> None:
        """Once a pass: a ring far longer than its records and a pass more (a first pass
        reads an hour of segments) is made that long once the records stop growing (a store
        younger than the span a pass keeps), so that the pages let go are written again a
        pass later; and what was added is counted afresh.

        *per_pass*: the records a pass is expected to add, where the caller can tell. The
        first pass's fit then fits the ring at once: a copy of every column in the first
        pass, not in the second, third or fourth (at 100k GPUs 0.45-0.5 s, which a steady
        pass cannot spare and a first pass can)."""
        steady = self.n <= self._fitted
        added = max(self.added, self._pass)  # (a shorter pass than the last is no reason)
        if per_pass and not self._fitted:
            steady, added = True, per_pass
        if steady and self.room > self.n + _SPARE_PASSES * added + 2 * _SMALLEST:
            self._move(self.n + added + added // 4 + _SMALLEST)
        self.added, self._fitted, self._pass = 0, self.n, self.added

    def held(self) -> int:
        """Bytes of memory the columns hold."""
        return sum(col.held() for col in self._cols.values())

    def view(self) -> PackedColumns:
        """The records as the frame's columns (the packed ones unpacked as they are read)."""
        lo, hi = self.start, self.start + self.n
        stored = {name: col.array[lo:hi] for name, col in self._cols.items() if name not in _OWN}
        return PackedColumns(
            stored, {name: col.packing for name, col in self._cols.items() if col.packing.packed}
        )

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the records where *mask*, in their order.

        Those before the last record let go move up to it, the rest stay where they are.
        """
        kept, gone = _let_go(mask)  # every record from *gone* on is kept
        if not gone:
            return
        self.placed = int(np.count_nonzero(mask[: min(self.placed, self.n)]))
        ahead = mask[:gone]
        shift = gone - (kept - (self.n - gone))  # records that go, all before *gone*
        lo = self.start
        # Pages let go are kept when the next pass or two write them again (the ring fits
        # the records), else given back (a first pass lets go of most of the segments it read).
        soon = self.room - kept <= 2 * self._pass + 2 * _SMALLEST
        for col in self._cols.values():
            values = col.array
            if shift < gone:
                values[lo + shift : lo + gone] = values[lo : lo + gone][ahead]
            col.release(lo, lo + shift, keep=soon)
        self.start += shift
        if self.start >= self.room:  # into the second half: the same memory in the first
            for col in self._cols.values():
                col.to_first_half(self.start, kept)
            self.start -= self.room
        self.n = kept

    def by_minute(self, first: int, stop: int | None = None, time: str = "ts") -> None:
        """Put records *first* to *stop* in the order of their minutes (in order within one).

        A pass appends file after file. Its records so ordered lie minute after minute,
        as the passes before's do: a minute let go is the first kept, and a window whose
        edges are whole minutes (the controller's) is one run of records, which its
        tables read in place (``features._rows``). A minute here is the one that ends at
        or after the record's *time*, as a window ends at or after its records.
        """
        lo, hi = self.start + first, self.start + (self.n if stop is None else stop)
        if hi - lo < 2:
            return
        minute = _minute(self._cols[time].array[lo:hi])
        with np.errstate(invalid="ignore"):  # a time of +-inf has no minute
            minute -= np.fmin.reduce(minute)  # the first minute (NaN: no record has a time)
        minute[~(minute < 65535)] = 65535  # an hour's span and more; no time: last
        order = np.argsort(minute.astype(np.uint16), kind="stable")  # a radix sort
        del minute
        for col in self._cols.values():
            col.array[lo:hi] = col.array[lo:hi][order]

    def cost_to_keep(self, mask: np.ndarray) -> tuple[int, int]:
        """(records :meth:`keep` would let go, records it would move)."""
        kept, end = _let_go(mask)
        gone = mask.size - kept
        return gone, end - gone


# How long a cold pass over an idle store stands for the next ones while nothing listed
# changes: a segment's length at the defaults.
IDLE_REUSE_S = 600.0


def _fingerprint(files: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """Each file's size and inode ((-1, -1): gone), as a stat finds them now."""
    out = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            out.append((-1, -1))
        else:
            out.append((st.st_size, st.st_ino))
    return tuple(out)


def _minute(times: np.ndarray) -> np.ndarray:
    """The minute (on the clock's minute grid) that ends at or after each of *times*, as
    a window on that grid ends at or after its records."""
    return np.ceil(times / 60)


def _let_go(mask: np.ndarray) -> tuple[int, int]:
    """Records kept where *mask*, and the index after the last one let go (0: none goes)."""
    kept = int(np.count_nonzero(mask))
    if kept == mask.size:
        return kept, 0
    return kept, mask.size - int(np.argmin(mask[::-1]))  # argmin: the first False


@dataclass
class _Pass:
    """What one pass read besides the kept records: counts of the transient tails."""

    files: int = 0
    records: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    newest: dict[int, np.ndarray] = field(default_factory=dict)
    ended: frozenset[int] = frozenset()  # segments ended a grace ago: their files are done


class Analyzer:
    """Analysis passes over one store (or *path*) that carry their state from pass to pass.

    ``Analyzer(settings).analyze(at)`` returns what
    ``guardctl.analyze.engine.analyze(None, settings, at)`` returns, reading only
    what was written since the previous pass. Not thread-safe: one pass at a time.
    """

    def __init__(
        self,
        settings: Settings,
        path: Path | None = None,
        *,
        grid_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """*grid_s*: a pass without a time judges the windows ending at the newest whole
        multiple of it (0: at the newest record), so that a window judged once is judged
        again, its records unchanged, by the pass a window length later, which keeps its
        figures (the controller passes its pass interval). *clock*: now, for the records
        stamped after it (:func:`~guardctl.analyze.engine.until_now`)."""
        self.settings = settings
        self.clock = clock
        self.grid_s = float(grid_s)  # (an int would give windows an int end)
        self.path = path
        self.root = path if path is not None else settings.store.root
        self.restarts = 0  # times the state was started over (for tests and logs)
        self.cold_passes = 0  # passes asked for a time before the kept records
        self.read = dict.fromkeys(_READ, 0)
        self._listing = Listing()
        # The listing has every file of a segment ending after this, and of every segment
        # not closed (see _grouped).
        self._listed_since = math.inf
        self._groups: tuple[int, dict[str, list[str]]] = (-1, {})  # by the listing's version
        self._buffer: np.ndarray | None = None  # the last group's read buffer, its pages mapped
        # Mirrors kept open between passes (an open and a close less per file and pass), up to
        # a quarter of the open-files limit as the first pass finds it (a daemon raises it
        # first): the process has other files to open.
        self._fd_room: int | None = None
        self._files: dict[str, _File] = {}
        self._held: dict[str, int] = {}  # files of closed segments read this pass: bytes held
        self._reset()

    def held_bytes(self) -> int:
        """Memory the kept records hold, mapped or not (a ring keeps the pages let go for the
        next records: they are not in the process's resident size until written again)."""
        return sum(cols.held() for cols in self._kept.values())

    def segment_files(self, *, list_again: bool = False) -> dict[str, list[str]]:
        """The store's files by segment as this analyzer's last pass listed them, without
        touching the store: the controller's leader closes segments from them rather than
        walking the store a second time each pass. *list_again* (a caller whose passes do not
        run this analyzer), or before any pass: listed now. Shared with the next pass: read
        only."""
        if list_again or self._groups[0] < 0:
            return self._grouped(self._since(steps_needed(self.settings.analyze), None))
        return self._groups[1]

    def kept_records(self) -> dict[str, tuple[int, float]]:
        """Per record kind: how many records are kept, and the oldest one's time (NaN: none),
        for benchmarks and logs."""
        out = {}
        for kind, cols in self._kept.items():
            ts = cols.data["ts"][: cols.n] if cols.n else np.empty(0)
            out[kind] = (cols.n, float(np.nanmin(ts)) if ts.size else math.nan)
        return out

    def close(self) -> None:
        """Close the mirrors kept open (the analyzer reopens them if it passes again)."""
        self._close_all()

    def _close_all(self) -> None:
        for state in self._files.values():
            self._close(state)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at exit, os may be gone before the analyzer
            self.close()

    def _close(self, state: _File) -> None:
        if state.fd >= 0:
            os.close(state.fd)
            state.fd = -1
            self._fd_room = (self._fd_room or 0) + 1

    def _reset(self) -> None:
        self._close_all()
        self._files = {}
        self._held = {}
        self._segment_ids: dict[str, int] = {}
        self._next_segment = 0
        self._counts: dict[int, _Segment] = {}
        self._names = _Names()
        self._kept = {kind: _Columns(kind) for kind in schema.KINDS}
        # Records before this time were let go: a pass needing them runs cold.
        self._floor = -math.inf
        # Records of the judged windows' kinds before this were never read (a first pass
        # reads its closed segments from where its windows need them): a pass needing them
        # runs cold.
        self._read_from = -math.inf
        # Windows' figures from earlier passes, by (end, length): a pass takes those of its
        # windows that no record joined or left since (see _touched).
        self._parts: Parts = {}
        self._files_seen: tuple[int, tuple[str, ...]] | None = None  # what _forget last saw
        # The last cold pass over an idle store: what it saw, the closed segments, its clock.
        self._last_idle: tuple[tuple[Any, ...], frozenset[str], float, Analysis] | None = None

    # --- one pass --------------------------------------------------------------------------

    def analyze(self, at: float | None = None, *, window_s: float | None = None) -> Analysis:
        """One analysis pass: the windows ending at *at* (default: the newest records)."""
        cfg = self.settings.analyze
        span = steps_needed(cfg, window_s)
        until = until_now(self.settings, self.clock())
        if at is not None and self._lost(at, window_s):
            return self._cold(at, window_s, until)
        for attempt in range(2):
            try:
                return self._pass(at, span, window_s, until)
            except _Restart:
                if attempt:
                    raise
                self.restarts += 1
                self._reset()
        raise AssertionError("unreachable")

    def _cold(self, at: float | None, window_s: float | None, until: float) -> Analysis:
        self.cold_passes += 1
        return analyze(self.path, self.settings, at, window_s=window_s, until=until)

    def _pass(
        self, at: float | None, span: float, window_s: float | None, until: float
    ) -> Analysis:
        cfg = self.settings.analyze
        since = self._since(span, at)
        wanted = self._wanted(at, span, until, since)
        if not self._reaches(wanted, since):  # the newest records lie in closed segments
            return self._idle(at, window_s, until, wanted)
        if self._past_raw(wanted, at, span):  # some lie in closed segments alone
            return self._cold(at, window_s, until)
        ids = {seg: self._segment_id(seg) for seg in wanted}  # (per segment: 12,500 files a pass)
        files = [(name, ids[seg]) for seg, names in wanted.items() for name in names]
        seen = (self._listing.version, tuple(wanted))
        if seen != self._files_seen:  # the same files as last pass: nothing to let go of
            self._forget({name for name, _ in files}, set(ids.values()))
            self._files_seen = seen
        extra = _Pass(ended=self._ended(wanted, ids))
        self.read = dict.fromkeys(_READ, 0)
        before = {kind: cols.n for kind, cols in self._kept.items()}
        self._read_closed(wanted, ids, self._first_end(wanted, at, until), window_s)
        uncovered = self._refresh(files, extra)
        for kind, cols in self._kept.items():
            cols.by_minute(before[kind])
        marks = {kind: cols.n for kind, cols in self._kept.items()}
        placed = False  # (the step records' times are placed: see the finally clause)
        length = window_s or cfg.window_s
        try:
            self._parse(uncovered, keep=False, extra=extra)
            # The kept tables of the windows new records joined go (a step's, once placed).
            self._touched(
                {
                    kind: cols.data["ts"][before[kind] : cols.n]
                    for kind, cols in self._kept.items()
                    if kind != "step"
                }
            )
            numbers = list(ids.values())
            newest_frame = self._newest_frame(numbers, extra)
            newest = default_at(newest_frame, length, until)
            ahead = ahead_of(newest_frame, until) if at is None else {}
            end = at if at is not None else self._on_grid(newest)
            counts = self._input(numbers, extra)
            if end is None:
                return nothing_judged(counts, cfg, ahead)
            if self._lost(end, window_s):  # the newest window moved back
                cold = self._cold(end if self.grid_s else at, window_s, until)  # past the kept
                return dataclasses.replace(cold, ahead=ahead)
            # Let go of what no window needs before judging, not after: the judging then
            # neither holds nor copies the records it would skip (a first pass reads an
            # hour of segments, of which a pass judges a quarter of an hour).
            judged = end - history_needed(cfg, window_s)
            start = self._steps_from(end, judged, length)
            self._prune(start, judged, length, marks)
            self._parts_from(end, judged, length)
            frame = self._frame()
            ends, placed = self._place_steps(marks["step"]), True
            if not self._history_ready(end, length):
                if at is not None:  # a time asked for, before what is kept
                    return self._cold(at, window_s, until)
                raise _Restart("a history window's steps changed after they were let go")
            mine = [(end - w * length, length) for w in range(cfg.persist_n)]
            kept = [dict(self._parts[k].tables) if k in self._parts else {} for k in mine]
            kept_parts = Kept(self._parts, ends, history=bool(self.grid_s))
            f = extract_again(
                frame, end, length, cfg.persist_n, kept_parts, **feature_settings(cfg)
            )
            result = judge(frame, f, cfg, {})
            self._rows_ahead(frame, ends, end, judged, length)
            self._windows_ahead(frame, ends, end, length)
            self.read["tables_kept"] = sum(
                self._parts[k].tables.get(name) is table
                for k, tables in zip(mine, kept, strict=True)
                for name, table in tables.items()
            )
            del frame, ends  # (views of the kept records, whose rings may move now)
            self._settle(start, end, judged, length, marks)
        finally:
            # Windows figured with the tails read for this pass only are figured again.
            self._touched(
                {
                    kind: cols.data["end" if kind == "step" else "ts"][marks[kind] : cols.n]
                    for kind, cols in self._kept.items()
                    if kind != "step" or placed
                },
                self._kept["step"].data["job"][marks["step"] : self._kept["step"].n],
            )
            if placed:  # the kept ones; the tails read for this pass only come
                self._kept["step"].placed = marks["step"]  # again next pass, as new records
            for kind, cols in self._kept.items():
                cols.n = marks[kind]  # the tails read for this pass only go
        files_n, records, bad = counts
        return dataclasses.replace(result, files=files_n, records=records, bad=bad, ahead=ahead)

    def _settle(
        self, start: float, end: float, judged: float, length: float, marks: dict[str, int]
    ) -> None:
        """After judging: let go of the step records whose windows' rank rows this pass
        figured ahead (a first pass reads the ranks' own history, 35 minutes of steps, of
        which the passes after it keep 20; *start*: where the pass's own step records
        began), then fit each kind's ring to what it keeps.
        Done here rather than by the next pass, so that no later pass copies a ring (at
        100k GPUs a fit is a copy of 0.45-0.5 s: a first pass can spare it, a steady one
        cannot)."""
        later = self._steps_from(end, judged, length)
        if later > start:  # (else nothing more goes: no kind's records looked at again)
            self._prune(later, judged, length, marks, kinds=("step",))
        since = cutoffs(max(start, later), judged, length)
        for kind, cols in self._kept.items():
            cols.fit(self._per_pass(cols, since[kind], end))

    def _ended(self, wanted: dict[str, list[str]], ids: dict[str, int]) -> frozenset[int]:
        """The segments of *wanted* that ended :data:`~guardctl.storage.segments.GRACE_S`
        before now: the agents have moved on to newer files."""
        now = self.clock()
        spans = {seg: segments.span(seg) for seg in wanted}
        return frozenset(
            ids[seg]
            for seg, bounds in spans.items()
            if bounds and bounds[1] + segments.GRACE_S < now
        )

    def _on_grid(self, newest: float | None) -> float | None:
        if newest is None or not self.grid_s:
            return newest
        return math.floor(newest / self.grid_s) * self.grid_s

    def _touched(self, times: dict[str, np.ndarray], jobs: np.ndarray | None = None) -> None:
        """Forget the kept tables that records at *times* (per kind) joined or left; with
        *jobs* (the step records' jobs, in the order of their times), only those jobs' rows
        of a window's rank table (see WindowPart.drop).

        A little wider than the window (a millionth of its length each side): a window's
        records are found by dividing, which may put one at an edge on either side. Only
        the windows between the oldest and newest of the times are looked into (the
        records a pass appends lie mostly in its newest minute; ``fmin`` and ``fmax`` skip
        a time that is NaN, as the comparisons do).
        """
        for kind, ts in times.items():
            if not ts.size:
                continue
            first, last = float(np.fmin.reduce(ts)), float(np.fmax.reduce(ts))
            for (end, length), part in self._parts.items():
                lo, hi = end - length * (1 + 1e-6), end + length * 1e-6
                if not (last > lo and first <= hi):
                    continue
                joined = (ts > lo) & (ts <= hi)
                if np.count_nonzero(joined):
                    part.drop(kind, jobs[joined] if jobs is not None and kind == "step" else None)

    def _parts_from(self, end: float, judged: float, length: float) -> None:
        """Forget the kept windows that begin before *judged*: no later pass judges them,
        and their oldest records may be let go. On the grid, the ones a pass (this one or
        a later one) reads as the ranks' own history keep their rank rows for that."""
        oldest = judged
        if self.grid_s:
            oldest = end - (self._history_windows() - 1) * length - length  # its start
        for key, part in list(self._parts.items()):
            if key[0] - key[1] < oldest - length * 1e-6:
                del self._parts[key]
            elif key[0] - key[1] < judged - length * 1e-6:
                part.keep_history_only()

    def _history_windows(self) -> int:
        """Windows a pass reads step records of: the judged ones and the ranks' own history."""
        return self.settings.analyze.persist_n + self.settings.analyze.own_history

    def _reach(self, window_s: float | None) -> float:
        """How long before a pass's end every record must be kept: the windows it judges,
        and on the grid only those (the history windows' rank rows are kept instead of
        their step records, see _steps_from)."""
        cfg = self.settings.analyze
        return history_needed(cfg, window_s) if self.grid_s else steps_needed(cfg, window_s)

    def _lost(self, end: float, window_s: float | None) -> bool:
        """Whether records a pass ending at *end* needs were let go or never read."""
        cfg = self.settings.analyze
        return (
            end - self._reach(window_s) < self._floor
            or end - history_needed(cfg, window_s) < self._read_from
        )

    def _first_end(
        self, wanted: dict[str, list[str]], at: float | None, until: float
    ) -> float | None:
        """Where the windows of a pass reading closed segments (a first pass) end at the
        earliest: at *at*, or where the newest segment begins, as a cold pass takes it
        (:func:`~guardctl.analyze.engine.load_recent`; where they end earlier, most nodes'
        records stopping before it, :meth:`_lost` sends the pass cold). None: not known (no
        dated segment)."""
        if at is not None:
            return at
        newest = segments.newest([name for name, files in wanted.items() if files], until)
        return None if newest is None else newest[0]

    def _steps_from(self, end: float, judged: float, length: float) -> float:
        """Where the step records this pass and later ones need begin: the ranks' own history,
        or on the grid the judged windows, or the oldest history window (of this pass or a
        later one on the grid) whose rank rows are not kept yet (a pass keeps them as it
        judges a window, and figures those of the windows no pass judged while it still
        has their records: see _rows_ahead)."""
        if not self.grid_s:
            return end - steps_needed(self.settings.analyze, length)
        return min([judged] + [key[0] - length for key in self._rows_missing(end, judged, length)])

    def _rows_missing(self, end: float, judged: float, length: float) -> list[tuple[float, float]]:
        """The windows (end, length) that a pass on the grid from *end* on reads as history,
        whose step records begin before *judged* (a pass may let them go) and whose rank
        rows are not kept, of those whose records are all still kept."""
        first, stop = self.settings.analyze.persist_n, self._history_windows()
        missing = set()
        step = 0
        while end + step * self.grid_s - stop * length < judged:
            later = end + step * self.grid_s
            for w in range(first, stop):
                key = (later - w * length, length)
                lost = key[0] - length < self._floor  # its records went: a pass restarts
                if not lost and key[0] - length < judged and not _has_history(self._parts.get(key)):
                    missing.add(key)
            step += 1
        return sorted(missing)

    def _rows_ahead(
        self, frame: Frame, ends: np.ndarray, end: float, judged: float, length: float
    ) -> None:
        """Figure the rank rows of the windows later passes read as history that no pass
        judged (most of a first pass's: it judged three windows of the half hour it read),
        while their step records are all here, so that the next pass lets those go: a
        daemon that has just started then holds 20 minutes of step records, not 35."""
        if self.grid_s:
            missing = self._rows_missing(end, judged, length)
            figure_history(frame, ends, missing, self.settings.analyze.low_quantile, self._parts)

    def _windows_ahead(self, frame: Frame, ends: np.ndarray, end: float, length: float) -> None:
        """On the grid, figure the tables of the windows that the passes of the next window
        length judge as older windows and that no pass judged: a daemon's first pass judged
        three windows of what it read, and each of the four passes after it would otherwise
        figure three windows, not only its newest. A window a pass judged keeps its tables
        (less those records dropped since, which the pass that judges it again figures)."""
        if not self.grid_s:
            return
        todo = set()
        step = 1
        while step * self.grid_s < length - 1e-6 * length:
            later = end + step * self.grid_s
            for w in range(1, self.settings.analyze.persist_n):
                key = (later - w * length, length)
                if key[0] <= end and not (key in self._parts and self._parts[key].tables):
                    todo.add(key)
            step += 1
        cfg = self.settings.analyze
        figure_windows(
            frame,
            ends,
            sorted(todo),
            cfg.hardware_xids,
            cfg.low_quantile,
            self._parts,
            cfg.pass_threads(),
        )

    def _history_ready(self, end: float, length: float) -> bool:
        """Whether each of this pass's history windows has its rank rows kept, or all its
        step records (a record that joined one after they were let go: not)."""
        if not self.grid_s:
            return True
        for w in range(self.settings.analyze.persist_n, self._history_windows()):
            key = (end - w * length, length)
            if key[0] - length < self._floor and not _has_history(self._parts.get(key)):
                return False
        return True

    def _wanted(
        self, at: float | None, span: float, until: float, since: float
    ) -> dict[str, list[str]]:
        """The segments (and their files) a cold pass at *at* (or before *until*) would read,
        of those listed from *since* on (and those not closed)."""
        groups = self._grouped(since)
        if at is not None:
            names = segments.needed(groups, at - span, at)
        else:
            recent = segments.recent(groups, span, until)
            names = sorted(groups) if recent is None else recent
        return {name: groups[name] for name in names}

    def _idle(
        self, at: float | None, window_s: float | None, until: float, wanted: dict[str, list[str]]
    ) -> Analysis:
        """The cold pass over a store nobody wrote to for hours (see :meth:`_reaches`), or the
        last one again, for up to :data:`IDLE_REUSE_S`, while nothing it could read has
        changed since: no directory listed anew, no segment closed, no file of the listed
        segments grown or replaced, and no record it left out as stamped ahead of its clock
        (a later clock could take it in). Passes a minute apart over a store whose agents are
        stopped (a maintenance window) then read its closed segments once in that time, not
        every minute. (Bytes written late into a closed segment's file, which the listing no
        longer names, wait that long.)"""
        files = [name for names in wanted.values() for name in names]
        seen = (at, window_s, self._listing.version, _fingerprint(files))
        closed = layout.closed_segments(self.root)
        last = self._last_idle
        if last is not None and last[:2] == (seen, closed) and 0 <= until - last[2] < IDLE_REUSE_S:
            return last[3]
        result = self._cold(at, window_s, until)
        self._last_idle = None if result.ahead else (seen, closed, until, result)
        return result

    def _past_raw(self, wanted: dict[str, list[str]], at: float | None, span: float) -> bool:
        """Whether a pass at *at* reaches back to a closed segment none of whose files it
        listed: raw retention (``[store] raw_retention_hours``) removed them, and only the
        closed segment holds their records, which a cold pass reads. Which segments are
        closed is looked up only for a pass reaching back that far (clocks apart)."""
        store = self.settings.store
        kept_s = min(store.raw_retention_hours * 3600.0, store.retention_days * 86400.0)
        now = self.clock()
        end = now if at is None else at
        if end - span - segments.SKEW_S >= now - kept_s:
            return False
        closed = segments.needed(layout.closed_segments(self.root), end - span, end)
        return any(name not in wanted for name in closed)

    def _since(self, span: float, at: float | None) -> float:
        """Where the files a pass needs begin: its own span, and the closed segments the
        controller's leader looks at again (those that may still grow), with room for clocks
        apart. Older closed segments stay out of the listing: weeks of them, read by no pass."""
        since = self.clock() - max(segments.LATE_S, 2 * span) - segments.SKEW_S
        return since if at is None else min(since, at - span - segments.SKEW_S)

    def _reaches(self, wanted: dict[str, list[str]], since: float) -> bool:
        """Whether the segments a pass wants are the store's newest: the listing holds every
        segment ending after *since*, but of older ones only those not closed yet, and a
        closed one left out may be newer than they are (a store nobody wrote to for hours).
        Which segments are closed is looked up only then."""
        ends = [bounds[1] for bounds in map(segments.span, wanted) if bounds is not None]
        if wanted and not ends:  # files named by no segment: always read as they are
            return True
        newest = max(ends, default=-math.inf)
        if newest >= since:
            return True
        closed = map(segments.span, layout.closed_segments(self.root))
        return not any(bounds is not None and bounds[1] > newest for bounds in closed)

    def _grouped(self, since: float) -> dict[str, list[str]]:
        """The store's files by segment from *since* on (and of segments not closed), listed
        now (only directories that changed) and grouped again only when the list changed."""
        if since < self._listed_since:  # older files than it kept are wanted: list them all
            self._listing.forget()
        self._listed_since = since
        files = self._listing.files(self.root, since)
        if self._groups[0] != self._listing.version:
            self._groups = (self._listing.version, segments.group_files(files))
        return self._groups[1]

    def _segment_id(self, segment: str) -> int:
        found = self._segment_ids.get(segment)
        if found is None:
            found = self._next_segment
            if any(_tag(n) == _tag(found) for n in self._counts):
                raise _Restart(segment)  # 256 read since one still read: never, but sure
            self._segment_ids[segment] = found
            self._next_segment += 1
            self._counts[found] = _Segment()
        return found

    def _forget(self, files: set[str], numbers: set[int]) -> None:
        """Let go of segments no longer read; a file gone from a segment still read restarts."""
        for name, state in list(self._files.items()):
            if name in files:
                continue
            if state.segment in numbers:
                raise _Restart(name)  # its records cannot be told from its segment's others
            self._close(state)
            del self._files[name]
        gone = [n for n in self._counts if n not in numbers]
        if any(self._counts[n].records for n in gone):
            tags = np.array([_tag(n) for n in gone], np.uint8)
            for kind, cols in self._kept.items():
                leaving = np.isin(cols.data["segment"][: cols.n], tags)
                if leaving.any():  # (their records may lie in any window: mostly in none)
                    self._touched({kind: _times_of(kind, cols, leaving)})
                    cols.keep(~leaving)
        for n in gone:
            del self._counts[n]
        self._segment_ids = {name: n for name, n in self._segment_ids.items() if n not in gone}

    # --- reading ---------------------------------------------------------------------------

    def _read_closed(
        self,
        wanted: dict[str, list[str]],
        ids: dict[str, int],
        end: float | None,
        window_s: float | None,
    ) -> None:
        """Read each closed segment none of whose files was read yet (a first pass, or one
        after a restart) from its Parquet files, as a cold pass does: faster than its files'
        column mirrors, which ``guardctl store prune`` removes once it can no longer grow
        (parsing the files instead costs several times more). Only the records that windows
        ending at *end* or later need are read: a first pass reads an hour of segments for
        the ranks' own history and clocks apart, of which its windows judge a quarter of an
        hour (the others are counted, and each node's newest among them kept, as a cold pass
        counts them). Its files are then read on from the bytes it holds (:meth:`_seen`)."""
        self._held = {}
        if not self.settings.analyze.cache:
            return
        todo = [seg for seg, names in wanted.items() if not any(n in self._files for n in names)]
        if not todo or not layout.manifests_dir(self.root).is_dir():
            return  # (pyarrow loads only where a segment was closed)
        from guardctl.storage import closed

        cfg = self.settings.analyze
        needed = None if end is None else needed_from(end, cfg, window_s)
        for seg in todo:
            found = closed.read_held(self.root, seg, wanted[seg], needed)
            if found is None:
                continue  # open, or no longer matching its files: they are read
            frame, held = found
            counts = self._counts[ids[seg]]
            counts.bad.update(frame.bad)
            number = np.full(1, ids[seg], np.int32)
            self._add(frame.cols, _tables(frame), number, None, True, None)
            self._held.update(held)
            self._count_let_go(frame, counts)
        if end is not None and self._held:  # (see _lost)
            self._read_from = max(self._read_from, end - history_needed(cfg, window_s))
            self._floor = max(self._floor, end - steps_needed(cfg, window_s))

    def _count_let_go(self, frame: Frame, counts: _Segment) -> None:
        """Count the records *frame* let go as it was read, and each node's newest among
        them (where the newest window ends), as :meth:`_note` counts those kept."""
        counts.records += frame.let_go
        newest = frame.let_go_times()
        if newest is None or not newest.size:
            return
        nodes = self._names.lut("nodes", frame.nodes)[: newest.size]
        counts.newest = _grown(counts.newest, len(self._names.lists["nodes"]))
        np.maximum.at(counts.newest, nodes, newest)

    def _refresh(
        self, files: Sequence[tuple[str, int]], extra: _Pass
    ) -> list[tuple[str, _File, int]]:
        """Read what is new in *files* into the kept records; return what no mirror covers yet.

        Those bytes (a batch whose mirror rows are not written yet) are parsed for
        one pass only, as a cold pass parses them, and read from the mirror later.
        """
        mirrored: list[tuple[str, _File, int]] = []
        parsed: list[tuple[str, _File, int]] = []
        for name, segment in files:
            self._look(name, segment, extra, mirrored, parsed)
        uncovered = self._read_here(mirrored, parsed)
        self._parse(parsed, keep=True, extra=extra)
        return uncovered

    def _look(
        self,
        name: str,
        segment: int,
        extra: _Pass,
        mirrored: list[tuple[str, _File, int]],
        parsed: list[tuple[str, _File, int]],
    ) -> None:
        """Stat one file; if it has new bytes, put it with those read from a mirror or parsed."""
        try:
            st = os.stat(name)
        except OSError:
            return  # vanished since it was listed: a cold pass skips it too
        state = self._seen(name, segment, st.st_size, st.st_ino, extra)
        if state is not None:
            (mirrored if state.mirror else parsed).append((name, state, st.st_size))

    def _seen(self, name: str, segment: int, size: int, ino: int, extra: _Pass) -> _File | None:
        """Count a file found *size* bytes long (inode *ino*); its state if it has new bytes."""
        extra.files += 1
        state = self._files.get(name)
        if state is None:
            state = self._files[name] = _File(
                segment,
                ino,
                mirror=self.settings.analyze.column_files,
                cols=mirror.mirror_path(name),
            )
            held = self._held.get(name)
            if held:  # its closed segment's records were read: what it gained since is parsed
                state.offset, state.mirror = held, False
        elif state.ino != ino or size < state.offset:
            raise _Restart(name)  # replaced or cut short
        if size > state.offset:
            return state
        state.pending = False
        if state.segment in extra.ended:  # done growing: its room goes to a file that grows
            self._close(state)
        return None

    def _read_here(
        self, mirrored: list[tuple[str, _File, int]], parsed: list[tuple[str, _File, int]]
    ) -> list[tuple[str, _File, int]]:
        uncovered = []
        for group in _groups_of(
            mirrored, [size - st.offset for _, st, size in mirrored], READ_BYTES
        ):
            uncovered += self._read_mirrors(group, parsed)
        return uncovered

    def _parse(self, todo: Sequence[tuple[str, _File, int]], *, keep: bool, extra: _Pass) -> None:
        """Parse the unread bytes of *todo*, segment by segment (kept, or for this pass only)."""
        by_segment: dict[int, list[tuple[str, _File, int]]] = {}
        for item in todo:
            by_segment.setdefault(item[1].segment, []).append(item)
        workers = self.settings.analyze.parsers()
        for segment, items in by_segment.items():
            tails = [_Tail(name, st.offset, size) for name, st, size in items]
            self.read["parsed_bytes"] += sum(t.size - t.offset for t in tails)
            self.read["files_opened"] += len(tails)
            frame, offsets, pending = parse_tails(tails, workers)
            if keep:
                for name, st, _ in items:
                    st.offset, st.pending = offsets[name], pending[name]
                self._counts[segment].bad.update(frame.bad)
            else:
                extra.bad.update(frame.bad)
                extra.bad["truncated"] += sum(pending.values())
            self._add(frame.cols, _tables(frame), np.full(1, segment, np.int32), None, keep, extra)

    # --- reading here ----------------------------------------------------------------------

    def _read_mirrors(
        self, todo: Sequence[tuple[str, _File, int]], parsed: list[tuple[str, _File, int]]
    ) -> list[tuple[str, _File, int]]:
        """Read the mirror rows written since the last pass; return the bytes still uncovered.

        Each file's rows go into one buffer behind its string rows so far and a
        mark row standing for everything already read, so that the column file
        reader checks and decodes them as if it had read the file whole.
        """
        if not todo:
            return []
        # Room for the new rows (fewer bytes than the lines they mirror) and, in front of
        # each file's, the string rows and the mark a tail is read behind.
        expected = sum(size - st.offset + len(st.strings) + mirror.WIDTH for _, st, size in todo)
        if self._fd_room is None:
            self._fd_room = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4
        reader = _TailReader(expected, self._buffer, self._fd_room)
        files: list[tuple[str, _File, int, int]] = []  # name, state, size, prefix rows
        try:
            for name, state, size in todo:
                got = reader.read(state)
                if got is None:
                    state.mirror = False  # no mirror of this file: parsed from here on
                    parsed.append((name, state, size))
                else:
                    files.append((name, state, size, got))
        finally:
            self._fd_room = reader.fd_room
            self.read["files_opened"] += reader.opened
        # The next group, and the next pass, read into the same pages (see READ_BYTES).
        self._buffer = reader.buf if reader.buf.size <= KEEP_BUFFER else None
        if not files:
            return []
        _put_behind(reader.rows(), reader.behind)
        rows, counts = [reader.rows()], reader.counts
        del reader  # (a buffer not kept goes before the records are copied: see _take)
        return self._take(rows, counts, files, parsed)

    def _take(
        self,
        box: list[np.ndarray],
        counts: list[int],
        files: list[tuple[str, _File, int, int]],
        parsed: list[tuple[str, _File, int]],
    ) -> list[tuple[str, _File, int]]:
        """Decode the rows read of *files* (in *box*, which this empties) into the kept records.

        The rows are in a list so that the caller holds no reference to them: a buffer
        not kept is let go once decoded, before the records are copied.
        """
        buf = box.pop()
        self.read["mirror_rows"] += sum(counts)
        self.read["mirror_files"] += len(files)
        decoded = decode(buf, counts, [f[2] for f in files], self.settings.analyze.pass_threads())
        rows = buf.view(_ROW)
        first = np.zeros(len(files), np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        used_end = first + decoded.rows_used
        file_of = np.repeat(np.arange(len(files)), counts)
        used = (np.arange(rows.size) < used_end[file_of]) & decoded.usable[file_of]
        numbers = np.array([f[1].segment for f in files], np.int32)
        per_kind = {
            kind: np.bincount(file_of[used & (rows["kind"] == code)], minlength=len(files))
            for kind, code in mirror.KIND_CODE.items()
        }
        uncovered = []
        prefixes = np.repeat(np.array([f[3] for f in files], np.int64), counts)
        fresh = np.arange(rows.size) >= np.repeat(first, counts) + prefixes
        strings = np.flatnonzero(used & fresh & (rows["kind"] == mirror.STRING))
        new_strings: dict[int, list[int]] = {}
        for r in strings.tolist():  # new string table entries: rare after a file's first read
            new_strings.setdefault(int(file_of[r]), []).append(r)
        raw = buf.data
        width = mirror.WIDTH
        # (As lists: tens of thousands of files a pass, a numpy scalar each costs more.)
        per_file = zip(
            files,
            decoded.usable.tolist(),
            first.tolist(),
            used_end.tolist(),
            decoded.covered.tolist(),
            decoded.stopped.tolist(),
            strict=True,
        )
        for j, ((name, state, size, prefix), usable, lo, hi, covered, stopped) in enumerate(
            per_file
        ):
            if not usable:
                state.mirror = False  # as a cold pass, parse what the mirror cannot give
                self._close(state)
                parsed.append((name, state, size))
                continue
            if j in new_strings:
                added = b"".join(raw[r * width : (r + 1) * width] for r in new_strings[j])
                state.strings += added
                state.strings_sum = mirror.checksum(state.strings)
            consumed = hi - lo - prefix  # rows of the mirror from where this read began
            if consumed > (1 if state.rows else 0):
                state.mark = bytes(raw[(hi - 1) * width : hi * width])
            state.rows += consumed - (1 if state.rows else 0)
            state.offset = covered
            if stopped:
                state.mirror = False  # a line the parser rejects: the rest is parsed
                self._close(state)
                parsed.append((name, state, size))
            elif state.offset < size:
                # A batch whose rows are not written yet, or a mirror replaced behind the
                # one kept open: opened again next pass.
                self._close(state)
                uncovered.append((name, state, size))
        # The rows are decoded: a buffer not kept goes before the records are copied
        # into the kept columns.
        del buf, rows, raw
        self._add(decoded.cols, decoded.frame_tables, numbers, per_kind, True, None)
        return uncovered

    def _add(
        self,
        cols: dict[str, Columns] | dict[str, dict[str, np.ndarray]],
        tables: dict[str, list[str]],
        numbers: np.ndarray,
        per_kind: dict[str, np.ndarray] | None,
        keep: bool,
        extra: _Pass | None,
    ) -> None:
        """Append decoded columns, their string indices mapped to the kept tables.

        Consumes *cols*: each kind's decoded block is let go once it is copied.
        """
        luts = {t: self._names.lut(t, tables[t]) for t in TABLES}
        for kind in list(cols):
            kcols = cols.pop(kind)
            n = int(kcols["ts"].size)
            if not n:
                continue
            out = dict(kcols)
            for name, table in TABLE_OF.items():
                if name in out:
                    out[name] = luts[table][out[name]]
            number = numbers if per_kind is None else np.repeat(numbers, per_kind[kind])
            out["segment"] = np.broadcast_to(number, (n,)) if number.size == 1 else number
            self._kept[kind].append({**out, "segment": _tags(out["segment"])})
            self._note(out, keep, extra)

    def _note(self, cols: dict[str, np.ndarray], keep: bool, extra: _Pass | None) -> None:
        """Count appended records and each node's newest, per segment."""
        size = len(self._names.lists["nodes"])
        segment = cols["segment"]
        for n in np.unique(segment).tolist():
            mine = segment == n
            if keep:
                counts = self._counts[n]
                counts.records += int(np.count_nonzero(mine))
                counts.newest = _grown(counts.newest, size)
                newest = counts.newest
            else:
                assert extra is not None
                extra.records += int(np.count_nonzero(mine))
                newest = extra.newest[n] = _grown(extra.newest.get(n, np.empty(0)), size)
            np.maximum.at(newest, cols["node"][mine], cols["ts"][mine])

    # --- what a pass judges ----------------------------------------------------------------

    def _input(self, numbers: Sequence[int], extra: _Pass) -> tuple[int, int, dict[str, int]]:
        """Files, records and bad lines, counted as a cold pass counts them."""
        bad: Counter[str] = Counter(extra.bad)
        records = extra.records
        for n in numbers:
            bad.update(self._counts[n].bad)
            records += self._counts[n].records
        pending = sum(1 for st in self._files.values() if st.pending and st.segment in numbers)
        if pending:
            bad["truncated"] += pending
        return extra.files, records, dict(bad)

    def _newest_frame(self, numbers: Sequence[int], extra: _Pass) -> Frame:
        """A frame of one record per node: its newest time (what :func:`default_at` reads)."""
        size = len(self._names.lists["nodes"])
        per = np.full(size, -np.inf)
        for n in numbers:
            per = np.maximum(per, _grown(self._counts[n].newest, size))
            if n in extra.newest:
                per = np.maximum(per, _grown(extra.newest[n], size))
        frame = Frame(nodes=self._names.lists["nodes"])
        seen = np.flatnonzero(np.isfinite(per))
        frame.cols["host"] = {**frame.cols["host"], "ts": per[seen], "node": seen.astype(np.int32)}
        return frame

    def _frame(self) -> Frame:
        names = self._names.lists
        frame = Frame()
        for table in TABLES:  # every string table the layout has (agent records' too)
            setattr(frame, table, names[table])
        for kind, cols in self._kept.items():
            frame.cols[kind] = cols.view()  # every segment kept is one this pass reads
        return frame

    def _place_steps(self, kept: int) -> np.ndarray:
        """Each kept step record's time as a cold pass places it (:func:`step_times`),
        figured again only for the groups that records new since the last pass joined.

        A (job, step) group's rows all have that step: per job, every row from the
        lowest step a new row has is taken, so each group touched is taken whole and gets
        what a cold pass gives it. Records read for one pass only (bytes no mirror covers
        yet, from *kept* on) are new again in the next pass, whose figures then count
        them again. The new records kept are then put in the order of their placed
        minutes, which are their windows' (the rank table reads them in place), with
        the kept ones whose minute changed.
        """
        cols = self._kept["step"]
        n, placed = cols.n, min(cols.placed, cols.n)
        job, step = cols.data["job"][:n], cols.data["step"][:n]
        ends = cols.data["end"][:n]
        if placed == n:
            return ends
        low = np.full(len(self._names.lists["jobs"]) + 1, np.iinfo(np.int64).max)
        np.minimum.at(low, job[placed:], step[placed:])
        # (By chunks: the lowest step of every record's job is a column of its own.)
        chunks = [slice(lo, lo + CHUNK) for lo in range(0, n, CHUNK)]
        redo = np.concatenate([c.start + np.flatnonzero(step[c] >= low[job[c]]) for c in chunks])
        old = ends[redo]
        threads = self.settings.analyze.pass_threads()  # (a first pass places them all)
        ends[redo] = step_ends(cols.data["ts"][redo], job[redo], step[redo], threads)
        self.read["steps_placed"] = int(redo.size)
        # A record that moved leaves one window and joins another; a new one joins one.
        moved = (old != ends[redo]) & (redo < placed)
        joined = moved | (redo >= placed)
        self._touched(
            {"step": np.concatenate((old[moved], ends[redo][joined]))},
            np.concatenate((job[redo][moved], job[redo][joined])),
        )
        cols.by_minute(
            self._reordered_from(redo[moved], old[moved], placed, kept), kept, time="end"
        )
        return ends

    def _reordered_from(self, moved: np.ndarray, old: np.ndarray, placed: int, kept: int) -> int:
        """Where the step records to put in minute order begin: the new ones (from *placed*),
        and from the first kept one (of *moved*, once at *old*) whose time left its minute,
        when that is not far back.

        A step's time is its job's ranks' median: the ranks that ended a step a pass
        before the others (a clock behind theirs) placed it then in a minute it leaves
        once the others come. Left where it lay, it is a hole in its old window's run of
        records, and every table of that window reads a copy of its records.
        """
        before, now = _minute(old), _minute(self._kept["step"].data["end"][moved])
        left = moved[(before != now) & ~(np.isnan(before) & np.isnan(now))]
        first = int(left.min()) if left.size else placed
        # Not far back: one left where it lay costs its window's tables a copy each pass,
        # but sorting all the kept records behind a rank's writer an hour late costs more.
        return first if kept - first <= max(2 * (kept - placed), kept // 4) else placed

    def _prune(
        self,
        start: float,
        judged: float,
        window_s: float,
        marks: dict[str, int],
        kinds: Sequence[str] = schema.KINDS,
    ) -> None:
        """Let go of records (of *kinds*) neither this pass nor a later one needs: every pass
        where they are the first kept (the usual case), else once they are a good share of
        the kept.

        Step records are kept from *start* (see _steps_from), the others only from
        *judged*, where the windows a pass judges begin. *marks* (per kind, where the
        tails read for this pass only begin) are moved with the records they follow.
        """
        since = cutoffs(start, judged, window_s)
        masks = {}
        for kind in kinds:
            cols = self._kept[kind]
            keep = ~(cols.data["ts"][: cols.n] < since[kind])  # (a record without a time stays)
            # Old records are mostly the first (a pass appends what is new): letting go
            # of them moves the few kept among them; else it waits until they are many.
            gone, moved = cols.cost_to_keep(keep)
            if gone and (moved * 8 <= cols.n or gone * 4 > cols.n):
                masks[kind] = keep
        for kind, mask in masks.items():
            marks[kind] = int(np.count_nonzero(mask[: marks[kind]]))
            self._kept[kind].keep(mask)
        if masks:
            self._floor = max(self._floor, start)

    def _per_pass(self, cols: _Columns, since: float, end: float) -> int:
        """The records of *cols* a pass is expected to add, for its first fit: those kept
        from *since* to *end*, per grid step (a pass a grid step), half as many again for
        a busier minute. 0, not known, off the grid (no pass length), where the ring is
        fitted already, or in a store younger than that span (its records still grow).

        Half again at most: a ring longer than its records by less than two passes keeps
        the pages let go for the next records (see _Columns.keep); one longer by three
        passes is fitted again."""
        if not self.grid_s or cols.fitted or not cols.n or not end - since >= self.grid_s:
            return 0
        if not float(np.fmin.reduce(cols.data["ts"][: cols.n])) <= since + self.grid_s:
            return 0  # (a store younger than the span kept; NaN: no record has a time)
        return math.ceil(1.5 * cols.n * self.grid_s / (end - since))


def _has_history(part: WindowPart | None) -> bool:
    return part is not None and (
        part.history is not None or ("rank" in part.tables and not part.stale)
    )


def _times_of(kind: str, cols: _Columns, which: np.ndarray) -> np.ndarray:
    """The times the kept records *which* (a mask) lie at in the windows: as written, and a
    step placed also where it was placed."""
    times = cols.data["ts"][: cols.n][which]
    if kind != "step":
        return times
    placed = min(cols.placed, cols.n)
    return np.concatenate((times, cols.data["end"][:placed][which[:placed]]))


def _tag(segment: int) -> int:
    """What the kept records hold of their segment's number: its low byte (a byte a record,
    not four: 80 MB at 100k GPUs). The segments read at once are a few of the last ones
    numbered, so their tags differ (_segment_id makes sure)."""
    return segment & 0xFF


def _tags(numbers: np.ndarray) -> np.ndarray:
    """:func:`_tag` of each of segment *numbers*, a byte each."""
    return (numbers & 0xFF).astype(np.uint8)


def _groups_of(todo: list[_T], sizes: Sequence[int], limit: int) -> list[list[_T]]:
    """*todo* in groups of at most about *limit* bytes each by *sizes* (one item may be more),
    in order."""
    groups: list[list[_T]] = [[]]
    size = 0
    for item, new in zip(todo, sizes, strict=True):
        if groups[-1] and size + new > limit:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += new
    return groups if groups[-1] else []


def _tail_at(state: _File) -> int:
    """Where a mirror's tail is read from: its last mark read (which the tail must start with)."""
    return _TAIL_FROM + state.rows * mirror.WIDTH


def _put_behind(buf: np.ndarray, behind: list[tuple[int, _File]]) -> None:
    """For each file of *behind* (where its bytes begin in *buf*, its state): put its string
    rows there, and check that the tail read behind them starts with the mark last read;
    that mark then stands for all of it, from byte 0 of the file, so that the tail decodes
    as the whole file would. All files at once: a call a file costs 0.2 s a pass at 100k GPUs.
    """
    if not behind:
        return
    width = mirror.WIDTH
    states = [state for _, state in behind]
    strings = [state.strings for state in states]
    marks = b"".join([state.mark for state in states])
    lengths = np.fromiter(map(len, strings), np.int64, len(states)) // width
    start = np.fromiter((end for end, _ in behind), np.int64, len(states)) // width
    at = start + lengths  # each tail's first row: the mark it was read from
    rows = buf.reshape(-1, width)  # (every file's bytes begin on a row)
    if len(marks) != len(states) * width or not np.array_equal(
        rows[at], np.frombuffer(marks, np.uint8).reshape(-1, width)
    ):
        raise _Restart("mirror rewritten")
    text = np.frombuffer(b"".join(strings), np.uint8).reshape(-1, width)
    rows[np.repeat(start - (np.cumsum(lengths) - lengths), lengths) + np.arange(len(text))] = text
    offset = np.fromiter((state.offset for state in states), np.int64, len(states))
    total = np.fromiter((state.strings_sum for state in states), np.int64, len(states))
    total += offset  # (wrapping, as mirror.mark_checksum does)
    mark = np.zeros((len(states), width // 8), "<i8")
    mark[:, _MARK_END], mark[:, _MARK_SUM] = offset, total
    as_bytes = mark.view(np.uint8)
    as_bytes[:, 0] = mirror.MARK
    rows[at] = as_bytes


def _tables(frame: Frame) -> dict[str, list[str]]:
    return {t: getattr(frame, t) for t in TABLES}


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    if a.size >= size:
        return a
    out = np.full(size, -np.inf)
    out[: a.size] = a
    return out


class _TailReader(RowBuffer):
    """Reads the new rows of many column mirrors into one buffer, one system call each."""

    def __init__(self, expected: int, spare: np.ndarray | None, fd_room: int) -> None:
        """Room for *expected* bytes: *spare* (an earlier group's buffer) if big enough;
        *fd_room* mirrors it may keep open."""
        reuse = spare is not None and spare.size >= expected + (1 << 20)
        # (A new one with room to spare: the next group's files may hold a little more.)
        super().__init__(0 if reuse else expected + expected // 4)
        self.fd_room = fd_room
        self.opened = 0  # mirrors opened (not kept open from an earlier pass)
        self.behind: list[tuple[int, _File]] = []  # tails read behind string rows: _put_behind
        if reuse:
            assert spare is not None
            self.view.release()
            self.buf, self.view = spare, spare.data

    def read(self, state: _File) -> int | None:
        """Add the file's new rows behind its prefix; return the prefix's rows, None: no
        mirror. Its mirror stays open in *state* while there is room."""
        fd = state.fd
        if fd < 0:
            try:
                fd = os.open(state.cols, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            self.opened += 1
            if self.fd_room > 0:
                state.fd, self.fd_room = fd, self.fd_room - 1
        kept = state.fd == fd
        try:
            try:
                got = self._tail(fd, state) if state.rows else self._whole(fd, state)
            except OSError:
                got = None
            if got is None and kept:  # not a mirror after all: not kept open
                state.fd, self.fd_room, kept = -1, self.fd_room + 1, False
            return got
        finally:
            if not kept:
                os.close(fd)

    def _whole(self, fd: int, state: _File) -> int | None:
        n = os.preadv(fd, [self.head, self.view[self.end :]], 0)
        while n - mirror.PREAMBLE_SIZE >= self.buf.size - self.end:
            self._grow()
            n = os.preadv(fd, [self.head, self.view[self.end :]], 0)
        if n < mirror.PREAMBLE_SIZE or not mirror.check_preamble(self.head, state.ino):
            return None
        self._done((n - mirror.PREAMBLE_SIZE) // mirror.WIDTH)
        return 0

    def _tail(self, fd: int, state: _File) -> int:
        width = mirror.WIDTH
        prefix = len(state.strings) // width
        at = self.end + len(state.strings)
        while True:
            while at + width >= self.buf.size:
                self._grow()
            n = os.preadv(fd, [self.view[at:]], _tail_at(state))
            if n < self.buf.size - at:
                break
            self._grow()
        if n < width:
            raise _Restart("mirror rewritten")
        self.behind.append((self.end, state))
        self._done(prefix + n // width)
        return prefix

    def _done(self, rows: int) -> None:
        self.counts.append(rows)
        self.end += rows * mirror.WIDTH
