"""Telemetry as columns: schema-v1 records turned into numpy arrays per record kind.

The analyzer never walks records one by one: it reads each file once into a
:class:`Frame` (one array per field, node/job/port names as small string
tables) and works on whole columns. Parsing keeps the schema's semantics
exactly (what :func:`guardctl.telemetry.schema.parse_line` rejects is skipped and counted
under the same reason) but checks batches of records a column at a time, and a
record shape once, not every line, where it must go record by record.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

import numpy as np

from guardctl.telemetry import schema
from guardctl.telemetry.columns import (
    FLOATS,
    INT_MAX,
    INT_MISSING,
    INTS,
    LAYOUT,
    NO_XID,
    STRINGS,
    TABLE_OF,
    TABLES,
)

try:  # an optional accelerator: same results, about 5x faster JSON decoding
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation
    _loads = json.loads

# The columns of each kind (floats, integers, string-table indices) come from the
# schema's field list, through guardctl.telemetry.columns; INT_MISSING and NO_XID
# stand for an absent integer and a null xid there too.
_FLOAT_MAX = float(np.finfo(np.float64).max)
# One kind's columns by field name: a dict, or the incremental analyzer's kept records
# (guardctl.analyze.packing.PackedColumns), which hands out each column as it is read.
Columns = Mapping[str, np.ndarray]


def _empty_kind(kind: str, rows: int = 0) -> dict[str, np.ndarray]:
    """A kind's columns, *rows* long (their values not set)."""
    cols: dict[str, np.ndarray] = {
        "ts": np.empty(rows, np.float64),
        "node": np.empty(rows, np.int32),
    }
    for name in FLOATS[kind]:
        cols[name] = np.empty(rows, np.float64)
    for name in INTS[kind]:
        cols[name] = np.empty(rows, np.int64)
    for name in STRINGS[kind]:
        cols[name] = np.empty(rows, np.int32)
    return cols


@dataclass
class Frame:
    """Columns of every kind plus the string tables their indices point into."""

    nodes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)  # "<device>:<port>"
    states: list[str] = field(default_factory=list)  # NIC port and collector states, as written
    collectors: list[str] = field(default_factory=list)  # agent records: collector names
    errors: list[str] = field(default_factory=list)  # agent records: collector errors
    cols: dict[str, Columns] = field(
        default_factory=lambda: {k: _empty_kind(k) for k in schema.KINDS}
    )
    bad: Counter[str] = field(default_factory=Counter)
    files: int = 0
    lines: int = 0
    # Records read and let go at once as older than a pass needs (see cut): how many, and
    # each node's newest time among them (aligned with nodes; -inf: none), so that a pass
    # counts what it read and finds where its windows end as if it had kept them.
    let_go: int = 0
    let_go_newest: np.ndarray | None = None

    def count(self, kind: str) -> int:
        return int(self.cols[kind]["ts"].size)

    @property
    def records(self) -> int:
        return sum(self.count(k) for k in schema.KINDS)

    @property
    def records_read(self) -> int:
        """The records held and those let go as they were read."""
        return self.records + self.let_go

    def let_go_times(self) -> np.ndarray | None:
        """Each node's newest time among the records let go (-inf: none), one per node;
        None when none were let go."""
        times = self.let_go_newest
        if times is None or times.size == len(self.nodes):
            return times
        return np.pad(times, (0, len(self.nodes) - times.size), constant_values=-np.inf)

    def span(self) -> tuple[float, float] | None:
        """Oldest and newest timestamp of any record, or None when empty."""
        lows = [c["ts"].min() for c in self.cols.values() if c["ts"].size]
        highs = [c["ts"].max() for c in self.cols.values() if c["ts"].size]
        return (float(min(lows)), float(max(highs))) if lows else None

    def nbytes(self) -> int:
        return sum(a.nbytes for c in self.cols.values() for a in c.values())


class _Tables:
    """Interning of strings into per-frame tables while parsing."""

    def __init__(self) -> None:
        self.index: dict[str, dict[str, int]] = {t: {} for t in TABLES}
        # raw value (a string, or a (device, port) pair) -> index, per table
        self.keys: dict[str, dict[Any, int]] = {}

    def intern(self, table: str, text: str) -> int:
        ids = self.index[table]
        found = ids.get(text)
        if found is None:
            found = ids[text] = len(ids)
        return found

    def intern_all(
        self, table: str, values: Iterable[Any], label: Callable[[Any], str] = str
    ) -> np.ndarray:
        """Indices of *values* in *table*; the marker for an absent value maps to -1."""
        values = tuple(values)
        ids = self.keys.setdefault(table, {_MISSING: -1})
        for value in dict.fromkeys(values):
            if value not in ids:
                ids[value] = self.intern(table, label(value))
        return np.fromiter(map(ids.__getitem__, values), np.int32, count=len(values))

    def names(self, table: str) -> list[str]:
        return list(self.index[table])


class _MissingType:
    """The type of the marker for a field absent from a record."""


_MISSING = _MissingType()
_KEYS = {k: ("v", "ts", "node", *schema.FIELDS[k]) for k in schema.KINDS}


# Records checked together on the column path: large enough that numpy's per-call cost
# vanishes, small enough that a batch holding a bad record is cheap to recheck record by record.
_BATCH = 1024
_ALLOWED: dict[str, dict[str, frozenset[type]]] = {
    kind: {
        name: frozenset(types)
        | ({type(None)} if name in schema.NULLABLE else set())
        | (set() if name in schema.REQUIRED[kind] else {_MissingType})
        for name, types in spec.items()
    }
    for kind, spec in schema.FIELDS.items()
}
_NUMERIC = frozenset({int, float})
# Per-kind columns as parsed, before the string fields become table indices: numbers as
# arrays, strings (and the NIC port number, part of the port's name) as lists of values.
_Piece = dict[str, Any]


class Parser:
    """Accumulates valid records of one input into per-kind columns.

    Two paths, one result. Lines of a file that all decode go into a batch that is
    checked a column at a time (a set of types per field, numpy for the values);
    a batch that holds any invalid record, and any file with a line that does not
    decode, goes record by record through :meth:`_feed_objects`, which counts each
    bad line under :func:`schema.validate`'s reason. Record order is kept.
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in schema.KINDS}
        self.pieces: dict[str, list[_Piece]] = {k: [] for k in schema.KINDS}
        self.tables = _Tables()
        self.bad: Counter[str] = Counter()
        self.lines = 0
        self._batch: list[Any] = []
        # type signatures already proven valid by schema.validate: later lines of the
        # same shape need only the value checks that types cannot express
        self._good: set[tuple[Any, ...]] = set()
        self._sparse: dict[str, set[str]] = {}

    def feed_lines(self, lines: Iterable[bytes]) -> None:
        """Parse and keep the valid records among *lines* (blank lines skipped)."""
        lines = lines if isinstance(lines, list) else list(lines)
        try:  # the usual case: every line decodes (one C loop, no per-line Python)
            objs = list(map(_loads, lines))
        except (ValueError, RecursionError):
            self._flush_batch()
            self._feed_raw(lines)
            return
        self.lines += len(objs)  # a blank line never decodes: none skipped here
        self._flush_rows()
        self._batch.extend(objs)
        if len(self._batch) >= _BATCH:
            self._flush_batch()

    def _feed_raw(self, lines: Iterable[bytes]) -> None:
        """Decode line by line: blank lines skipped, undecodable ones counted."""
        loads, objs = _loads, []
        for raw in lines:
            if not raw.strip():
                continue
            self.lines += 1
            try:
                obj = loads(raw)
            except (ValueError, RecursionError):
                obj = self._slow_parse(raw)
                if obj is None:
                    continue
            objs.append(obj)
        self._feed_objects(objs)

    def _feed_objects(self, objs: Iterable[Any]) -> None:
        """Keep the valid records among decoded *objs*, one at a time."""
        # Hot loop where it runs: locals only, one validation per record shape.
        keys_of, good, rows = _KEYS, self._good, self.rows
        missing, fmax = _MISSING, _FLOAT_MAX
        for obj in objs:
            if type(obj) is not dict:
                self._reject(obj)
                continue
            kind: str = obj.get("kind")  # type: ignore[assignment]
            keys = keys_of.get(kind) if type(kind) is str else None
            if keys is None:
                self._reject(obj)
                continue
            values = tuple(map(obj.get, keys, repeat(missing)))
            signature = (kind, *map(type, values))
            if signature not in good:
                if not self._reject(obj):
                    continue
                good.add(signature)
                self._note_sparse(kind, signature)
            elif values[0] != 1 or not values[2] or not 0 <= values[1] <= fmax:
                self._reject(obj)  # counted under the schema's own reason
                continue
            rows[kind].append(values)

    def _flush_batch(self) -> None:
        objs, self._batch = self._batch, []
        if not objs:
            return
        pieces = _batch_pieces(objs)
        if pieces is None:  # some record is not valid: find and count it the slow way
            self._feed_objects(objs)
            return
        for kind, piece in pieces.items():
            self.pieces[kind].append(piece)

    def _flush_rows(self) -> None:
        for kind, rows in self.rows.items():
            if rows:
                self.pieces[kind].append(self._row_piece(kind, rows))
                self.rows[kind] = []

    def _note_sparse(self, kind: str, signature: tuple[Any, ...]) -> None:
        # Fields that may be absent or null in this kind's accepted records: only
        # those need the per-value substitution when columns are built.
        sparse = self._sparse.setdefault(kind, set())
        for key, tp in zip(_KEYS[kind], signature[1:], strict=True):
            if tp is _MissingType or tp is type(None):
                sparse.add(key)

    def _slow_parse(self, raw: bytes) -> Any:
        # The fast decoder refused it; the standard one decides what the schema says.
        try:
            return schema.parse_line(raw)
        except schema.BadRecord as exc:
            self.bad[exc.reason] += 1
            return None
        except RecursionError:  # JSON nested beyond the decoder's stack
            self.bad["not_json"] += 1
            return None

    def _reject(self, obj: Any) -> bool:
        """Validate *obj* the slow way; count and return False when it is bad."""
        try:
            schema.validate(obj)
        except schema.BadRecord as exc:
            self.bad[exc.reason] += 1
            return False
        return True

    def frame(self) -> Frame:
        self._flush_batch()
        self._flush_rows()
        frame = Frame(bad=self.bad, lines=self.lines)
        for kind, pieces in self.pieces.items():
            if pieces:
                frame.cols[kind] = self._columns(kind, pieces, frame.bad)
        for table in TABLES:
            setattr(frame, table, self.tables.names(table))
        return frame

    def _row_piece(self, kind: str, rows: list[tuple[Any, ...]]) -> _Piece:
        """Columns of records accepted one at a time (types proven per shape)."""
        keys = _KEYS[kind]
        by_name = dict(zip(keys, zip(*rows, strict=True), strict=True))
        sparse = self._sparse.get(kind, set())
        piece: _Piece = {"ts": np.asarray(by_name["ts"], np.float64), "node": by_name["node"]}
        for name in FLOATS[kind]:
            col = by_name[name]
            if name in sparse:
                col = tuple(math.nan if v is _MISSING else v for v in col)
            piece[name] = np.array(col, np.float64)
        for name in INTS[kind]:
            null = NO_XID if name == "xid" else INT_MISSING
            col = by_name[name]
            if name in sparse:
                col = tuple(null if v is _MISSING or v is None else v for v in col)
            piece[name] = _int_column(col)
        for name in _RAW[kind]:
            piece[name] = by_name[name]
        # Types were proven per shape; finiteness is a value check, done on whole columns.
        finite = np.ones(len(rows), bool)
        for name in FLOATS[kind]:
            finite &= ~np.isinf(piece[name])
            nan = np.isnan(piece[name])
            if nan.any():  # NaN stands for "absent"; a NaN written in the record is bad
                present = np.array([v is not _MISSING for v in by_name[name]], bool)
                present &= np.array([v is not None for v in by_name[name]], bool)
                finite &= ~(nan & present)
        piece["keep"] = finite
        return piece

    def _columns(self, kind: str, pieces: list[_Piece], bad: Counter[str]) -> dict[str, np.ndarray]:
        def joined(name: str) -> Any:
            if len(pieces) == 1:
                return pieces[0][name]
            if isinstance(pieces[0][name], np.ndarray):
                return np.concatenate([p[name] for p in pieces])
            return list(chain.from_iterable(p[name] for p in pieces))

        cols: dict[str, np.ndarray] = {
            "ts": joined("ts"),
            "node": self.tables.intern_all("nodes", joined("node")),
        }
        for name in (*FLOATS[kind], *INTS[kind]):
            cols[name] = joined(name)
        kl = LAYOUT.kinds[kind]
        for name in kl.strings:
            table, sources = TABLE_OF[name], kl.sources[name]
            if len(sources) == 1:
                cols[name] = self.tables.intern_all(table, joined(name))
            else:  # one name made of several fields: a NIC port is "<device>:<port>"
                parts = zip(*map(joined, sources), strict=True)
                cols[name] = self.tables.intern_all(table, parts, _join_name)
        keep = joined("keep")
        if not keep.all():
            bad["not_finite"] += int((~keep).sum())
            cols = {name: col[keep] for name, col in cols.items()}
        return cols


def _join_name(parts: tuple[Any, ...]) -> str:
    return ":".join(map(str, parts))


# fields kept as values until the string tables are built
_RAW = {kind: kl.raw for kind, kl in LAYOUT.kinds.items()}


def _batch_pieces(objs: list[Any]) -> dict[str, _Piece] | None:
    """Columns of a batch of decoded records, or None unless every record is valid.

    Valid means exactly what :func:`schema.validate` accepts; anything unusual
    (a wrong type, a value out of range, an integer numpy cannot hold) gives None
    and the batch is rechecked record by record.
    """
    if set(map(type, objs)) != {dict}:
        return None
    kinds: list[Any] = list(map(dict.get, objs, repeat("kind")))
    try:
        present: set[str] = set(kinds)
    except TypeError:  # an unhashable "kind"
        return None
    if not present <= _KIND_SET:
        return None
    out: dict[str, _Piece] = {}
    for kind in sorted(present, key=schema.KINDS.index):
        sel = (
            objs
            if len(present) == 1
            else [o for o, k in zip(objs, kinds, strict=True) if k == kind]
        )
        try:
            piece = _kind_piece(kind, sel)
        except (OverflowError, TypeError, ValueError):
            return None
        if piece is None:
            return None
        out[kind] = piece
    return out


_KIND_SET = frozenset(schema.KINDS)


def _kind_piece(kind: str, objs: list[dict[str, Any]]) -> _Piece | None:
    n = len(objs)

    def column(name: str) -> list[Any]:
        return list(map(dict.get, objs, repeat(name), repeat(_MISSING)))

    if column("v").count(1) != n:  # validate: obj.get("v") != 1 is bad
        return None
    ts_col = column("ts")
    if not set(map(type, ts_col)) <= _NUMERIC:
        return None
    ts = np.array(ts_col, np.float64)
    if not (np.isfinite(ts).all() and (ts >= 0).all()):
        return None
    node = column("node")
    if set(map(type, node)) != {str} or not all(node):
        return None
    piece: _Piece = {"ts": ts, "node": node}
    allowed = _ALLOWED[kind]
    values = {}
    for name in schema.FIELDS[kind]:
        col = column(name)
        types = set(map(type, col))
        if not types <= allowed[name]:
            return None
        values[name] = (col, types)
    for name in FLOATS[kind]:
        col, types = values[name]
        absent = col.count(_MISSING) if _MissingType in types else 0
        if absent:
            col = [math.nan if v is _MISSING else v for v in col]
        arr = np.array(col, np.float64)
        if np.isinf(arr).any() or int(np.isnan(arr).sum()) != absent:
            return None
        piece[name] = arr
    for name in INTS[kind]:
        col, types = values[name]
        if _MissingType in types or type(None) in types:
            null = NO_XID if name == "xid" else INT_MISSING
            col = [null if v is _MISSING or v is None else v for v in col]
        piece[name] = _int_column(col)
    for name in _RAW[kind]:
        piece[name] = values[name][0]
    piece["keep"] = np.ones(n, bool)
    return piece


def _int_column(values: Sequence[int]) -> np.ndarray:
    try:
        return np.array(values, np.int64)
    except OverflowError:  # a counter beyond 64 bits: valid JSON, saturate it
        top, low = INT_MAX, INT_MISSING + 1
        return np.array([min(max(v, low), top) for v in values], np.int64)


def parse_lines(lines: Iterable[bytes]) -> Frame:
    """Parse raw JSON lines (each ending in a newline) into a frame."""
    parser = Parser()
    parser.feed_lines(lines)
    return parser.frame()


def _remap(table: list[str], names: Sequence[str], merged: dict[str, int]) -> np.ndarray:
    for name in names:
        if name not in merged:
            merged[name] = len(table)
            table.append(name)
    return np.array([merged[n] for n in names], np.int32)


# The string table each string column's indices point into.
_TABLE_OF_COLUMN = {"node": "nodes", **TABLE_OF}


class Builder:
    """A frame filled a part at a time (a file's records, a closed segment's), each record
    written once, into columns made as long as the parts' records at the start.

    Joining parts made on their own copies every record again, into memory the kernel must
    first hand over; a reader that knows how many records are coming (a closed segment's
    manifest says) writes them straight into their place here. Rows a time filter left out
    are never written: the memory past what was filled is never touched. Parts beyond the
    rows given at the start (bytes appended to files since) make the columns longer.
    """

    def __init__(self, rows: Mapping[str, int], threads: int = 1) -> None:
        self.threads = threads
        self.out = Frame()  # tables and input counts; columns in frame()
        self._rows = dict(rows)
        self._merged: dict[str, dict[str, int]] = {t: {} for t in TABLES}
        self._cols: dict[str, dict[str, np.ndarray]] = {}
        self._filled = dict.fromkeys(schema.KINDS, 0)
        self._let_go: list[tuple[np.ndarray, np.ndarray]] = []  # (node map, let-go newest)
        self._pool: ThreadPoolExecutor | None = None

    def names(self, table: str, names: Sequence[str]) -> np.ndarray:
        """Where each of *names* is in this frame's *table* (interned where new), then -1:
        indices into the result map -1 (an absent value) to -1."""
        found = _remap(getattr(self.out, table), names, self._merged[table])
        return np.append(found, np.int32(-1))

    def rows(self, kind: str, n: int) -> dict[str, np.ndarray]:
        """The next *n* rows of *kind*'s columns, for the caller to write."""
        start = self._filled[kind]
        cols = self._cols.get(kind)
        if cols is None:
            cols = self._cols[kind] = _empty_kind(kind, max(start + n, self._rows.get(kind, 0)))
        elif start + n > cols["ts"].size:  # rows not given at the start: twice as long
            for name, col in cols.items():
                cols[name] = _grown(col, start, max(start + n, 2 * col.size))
        self._filled[kind] = start + n
        return {name: col[start : start + n] for name, col in cols.items()}

    def add(self, frame: Frame, *, consume: bool = False) -> None:
        """Write *frame*'s records (its string indices mapped into this frame's tables) and
        add its input counts. A kind's records that are the first and at least as many as
        were to come are taken as they are, not copied. With *consume*, *frame* is emptied
        of its records, each column let go once written (the caller must hold no other
        reference to them): the part and the frame are never both whole in memory."""
        maps = {t: self.names(t, getattr(frame, t)) for t in TABLES}
        copies: list[tuple[dict[str, np.ndarray], str, int, Columns, np.ndarray | None, bool]] = []
        for kind, cols in frame.cols.items():
            n = int(cols["ts"].size)
            if not n:
                continue
            if kind not in self._cols and n >= self._rows.get(kind, 0):
                self._take(kind, cols, maps)
                continue
            if kind not in self._cols:
                self._cols[kind] = _empty_kind(kind, self._rows[kind])
            start = self._filled[kind]
            self._filled[kind] = start + n
            for name in cols:
                table = _TABLE_OF_COLUMN.get(name)
                lut = None if table is None else maps[table]
                copies.append((self._cols[kind], name, start, cols, lut, consume))
        self.each(_write, copies)
        if frame.let_go_newest is not None:
            self._let_go.append((maps["nodes"], frame.let_go_newest))
        if consume:
            frame.cols = {}
        self.add_counts(frame)

    def _take(self, kind: str, cols: Columns, maps: Mapping[str, np.ndarray]) -> None:
        taken: dict[str, np.ndarray] = {}
        for name, col in cols.items():
            table = _TABLE_OF_COLUMN.get(name)
            lut = None if table is None else maps[table]
            if lut is None or np.array_equal(lut[:-1], np.arange(lut.size - 1)):
                taken[name] = col  # numbers, or names already numbered as in this frame
            else:
                taken[name] = lut[col]
        self._cols[kind] = taken
        self._filled[kind] = int(cols["ts"].size)

    def add_counts(self, frame: Frame) -> None:
        """Add *frame*'s input counts (bad lines, files, lines, records let go)."""
        self.out.bad.update(frame.bad)
        self.out.files += frame.files
        self.out.lines += frame.lines
        self.out.let_go += frame.let_go

    def let_go(self, records: int, newest: Mapping[str, float]) -> None:
        """*records* read and let go at once, and each node's newest time among them."""
        self.out.let_go += records
        lut = self.names("nodes", list(newest))
        self._let_go.append((lut[:-1], np.fromiter(newest.values(), np.float64, len(newest))))

    def each(self, work: Callable[..., None], jobs: Sequence[tuple[Any, ...]]) -> None:
        """``work(*job)`` for every job, on this builder's threads (numpy's copies let go of
        the interpreter, and the memory they write is the kernel's to give on every core)."""
        if self.threads > 1 and len(jobs) > 1:
            if self._pool is None:  # one pool for every part: a segment is read in many
                self._pool = ThreadPoolExecutor(self.threads)
            list(self._pool.map(lambda job: work(*job), jobs))
        else:
            for job in jobs:
                work(*job)

    def mark(self) -> tuple[dict[str, int], dict[str, int], int]:
        """Where the frame stands, for :meth:`undo`."""
        return dict(self._filled), {t: len(getattr(self.out, t)) for t in TABLES}, len(self._let_go)

    def undo(self, mark: tuple[dict[str, int], dict[str, int], int]) -> None:
        """Forget the records and names added since *mark* (a part that could not be read
        whole); input counts are added only once a part is whole, so there are none."""
        filled, tables, let_go = mark
        self._filled.update(filled)
        for table, size in tables.items():
            names = getattr(self.out, table)
            for name in names[size:]:
                del self._merged[table][name]
            del names[size:]
        del self._let_go[let_go:]

    def frame(self) -> Frame:
        """The frame: each kind's columns as far as they were filled."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        out = self.out
        for kind, cols in self._cols.items():
            out.cols[kind] = {name: col[: self._filled[kind]] for name, col in cols.items()}
        if self._let_go:
            out.let_go_newest = np.full(len(out.nodes), -np.inf)
            for lut, times in self._let_go:
                np.maximum.at(out.let_go_newest, lut[: times.size], times)
        return out


def _write(
    into: dict[str, np.ndarray],
    name: str,
    start: int,
    part: Columns,
    lut: np.ndarray | None,
    consume: bool,
) -> None:
    """Write column *name* of *part* into column *name* of *into* from row *start* (with
    *lut*, string indices mapped), making it longer where it must be; with *consume*, *part*
    no longer holds it. A column at a time: each part's column is let go before the next
    is made longer, so the memory it held (malloc keeps it) serves the next."""
    values = part.pop(name) if consume and isinstance(part, dict) else part[name]
    end = start + values.size
    if end > into[name].size:
        into[name] = _grown(into[name], start, end)
    if lut is None:
        into[name][start:end] = values
    else:
        np.take(lut, values, out=into[name][start:end])


def _grown(col: np.ndarray, filled: int, rows: int) -> np.ndarray:
    """*col* (its first *filled* values) in a column with room for *rows*."""
    out = np.empty(rows, col.dtype)
    out[:filled] = col[:filled]
    return out


def concat(frames: Sequence[Frame], *, consume: bool = False, threads: int = 1) -> Frame:
    """Join frames (one per file) into one, merging their string tables. With *consume*,
    *frames* are emptied of their records as they are joined, so that each part is let go
    once written (the caller must hold no other reference to it). With *threads*, that many
    columns are written at a time."""
    if len(frames) == 1:  # nothing to merge: no copy (a pass over 100k GPUs reads one segment)
        return frames[0]
    builder = Builder({k: sum(f.count(k) for f in frames) for k in schema.KINDS}, threads)
    for frame in frames:
        builder.add(frame, consume=consume)
    return builder.frame()


def newest_per_node(frame: Frame) -> np.ndarray | None:
    """Each node's newest record time (-inf: none), one per node, or None for a frame
    without records (the records let go as they were read count: see cut)."""
    let_go = frame.let_go_times()
    newest = [let_go] if let_go is not None and let_go.size else []
    for cols in frame.cols.values():
        if cols["ts"].size:
            per = np.full(len(frame.nodes), -np.inf)
            np.maximum.at(per, cols["node"], cols["ts"])
            newest.append(per)
    if not newest:
        return None
    return np.max(np.vstack(newest), axis=0)


def cut(frame: Frame, since: Mapping[str, float]) -> Frame:
    """Let go of the records of each kind stamped before *since* (per kind; a kind not named
    keeps all), in place: counted, and each node's newest among them kept (see Frame)."""
    newest = frame.let_go_times()
    for kind, cols in frame.cols.items():
        old = cols["ts"] < since.get(kind, -math.inf)
        gone = int(np.count_nonzero(old))
        if not gone:
            continue
        if newest is None:
            newest = np.full(len(frame.nodes), -np.inf)
        np.maximum.at(newest, cols["node"][old], cols["ts"][old])
        keep = ~old
        frame.cols[kind] = {name: col[keep] for name, col in cols.items()}
        frame.let_go += gone
    frame.let_go_newest = newest
    return frame


def select(frame: Frame, start: float, end: float) -> Frame:
    """The records with ``start <= ts <= end`` (tables and input counts kept)."""
    out = Frame(bad=frame.bad, files=frame.files, lines=frame.lines, let_go=frame.let_go)
    out.let_go_newest = frame.let_go_newest
    for table in TABLES:
        setattr(out, table, getattr(frame, table))
    for kind, cols in frame.cols.items():
        keep = (cols["ts"] >= start) & (cols["ts"] <= end)
        out.cols[kind] = {name: col[keep] for name, col in cols.items()}
    return out


def sort_by_time(frame: Frame) -> Frame:
    """The same records with each kind sorted by timestamp (for repeated time slicing)."""
    out = select(frame, -math.inf, math.inf)
    for kind, cols in out.cols.items():
        order = np.argsort(cols["ts"], kind="stable")
        out.cols[kind] = {name: col[order] for name, col in cols.items()}
    return out


def slice_sorted(frame: Frame, start: float, end: float) -> Frame:
    """Records with ``start <= ts <= end`` of a frame from :func:`sort_by_time` (no copy)."""
    out = select(frame, math.inf, -math.inf)  # empty, same tables
    for kind, cols in frame.cols.items():
        lo, hi = np.searchsorted(cols["ts"], [start, end], side="left")
        hi = np.searchsorted(cols["ts"], end, side="right")
        out.cols[kind] = {name: col[lo:hi] for name, col in cols.items()}
    return out
