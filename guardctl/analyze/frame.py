"""Telemetry as columns: schema-v1 records turned into numpy arrays per record kind.

The analyzer never walks records one by one: it reads each file once into a
:class:`Frame` (one array per field, node/job/port names as small string
tables) and works on whole columns. Parsing keeps the schema's semantics
exactly (what :func:`guardctl.schema.parse_line` rejects is skipped and counted
under the same reason) but validates a record shape once, not every line.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from guardctl import schema

try:  # an optional accelerator: same results, about 5x faster JSON decoding
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation
    _loads = json.loads

INT_MISSING = np.iinfo(np.int64).min  # an integer field absent from the record
NO_XID = -1  # "xid": null, no XID in the interval

# Columns per kind, in the order they are extracted. "F" float64, "I" int64,
# "S" a string-table index (node, job, port), "X" special (state, port).
GPU_FLOATS = ("sm_clock_mhz", "power_w", "power_limit_w", "temp_c", "util_pct")
GPU_INTS = (
    "gpu",
    "clock_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "pcie_replay",
    "nvlink_crc_errors",
    "xid",
)
HOST_FLOATS = ("cpu_pct", "load1", "mem_used_pct")
NIC_FLOATS = ("rate_gbps",)
NIC_INTS = (
    "symbol_errors",
    "link_error_recovery",
    "link_downed",
    "rcv_errors",
    "xmit_wait",
    "xmit_bytes",
)
STEP_FLOATS = ("step_s", "compute_s", "comm_s")
STEP_INTS = ("rank", "step")

FLOATS = {"gpu": GPU_FLOATS, "host": HOST_FLOATS, "nic": NIC_FLOATS, "step": STEP_FLOATS}
INTS = {"gpu": GPU_INTS, "host": (), "nic": NIC_INTS, "step": STEP_INTS}
# string fields that become an index into a table of the frame
STRINGS = {"gpu": (), "host": (), "nic": ("port", "state"), "step": ("job",)}


def _empty_kind(kind: str) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {
        "ts": np.empty(0, np.float64),
        "node": np.empty(0, np.int32),
    }
    for name in FLOATS[kind]:
        cols[name] = np.empty(0, np.float64)
    for name in INTS[kind]:
        cols[name] = np.empty(0, np.int64)
    for name in STRINGS[kind]:
        cols[name] = np.empty(0, np.int32)
    return cols


@dataclass
class Frame:
    """Columns of every kind plus the string tables their indices point into."""

    nodes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)  # "<device>:<port>"
    states: list[str] = field(default_factory=list)  # NIC port states, as written
    cols: dict[str, dict[str, np.ndarray]] = field(
        default_factory=lambda: {k: _empty_kind(k) for k in schema.KINDS}
    )
    bad: Counter[str] = field(default_factory=Counter)
    files: int = 0
    lines: int = 0

    def count(self, kind: str) -> int:
        return int(self.cols[kind]["ts"].size)

    @property
    def records(self) -> int:
        return sum(self.count(k) for k in schema.KINDS)

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
        self.index: dict[str, dict[str, int]] = {
            "nodes": {},
            "jobs": {},
            "ports": {},
            "states": {},
        }
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


class Parser:
    """Accumulates valid records of one input into per-kind row lists."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in schema.KINDS}
        self.tables = _Tables()
        self.bad: Counter[str] = Counter()
        self.lines = 0
        # type signatures already proven valid by schema.validate: later lines of the
        # same shape need only the value checks that types cannot express
        self._good: set[tuple[Any, ...]] = set()
        self._sparse: dict[str, set[str]] = {}

    def feed_lines(self, lines: Iterable[bytes]) -> None:
        """Parse and keep the valid records among *lines* (blank lines skipped)."""
        # Hot loop (millions of lines): locals only, one validation per record shape.
        loads, keys_of, good, rows = _loads, _KEYS, self._good, self.rows
        missing, inf = _MISSING, math.inf
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
            elif values[0] != 1 or not values[2] or not 0 <= values[1] < inf:
                self._reject(obj)  # counted under the schema's own reason
                continue
            rows[kind].append(values)

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
        frame = Frame(bad=self.bad, lines=self.lines)
        for kind, rows in self.rows.items():
            if rows:
                frame.cols[kind] = self._columns(kind, rows, frame.bad)
        frame.nodes = self.tables.names("nodes")
        frame.jobs = self.tables.names("jobs")
        frame.ports = self.tables.names("ports")
        frame.states = self.tables.names("states")
        return frame

    def _columns(
        self, kind: str, rows: list[tuple[Any, ...]], bad: Counter[str]
    ) -> dict[str, np.ndarray]:
        keys = _KEYS[kind]
        by_name = dict(zip(keys, zip(*rows, strict=True), strict=True))
        sparse = self._sparse.get(kind, set())
        cols: dict[str, np.ndarray] = {
            "ts": np.asarray(by_name["ts"], np.float64),
            "node": self.tables.intern_all("nodes", by_name["node"]),
        }
        for name in FLOATS[kind]:
            col = by_name[name]
            if name in sparse:
                col = tuple(math.nan if v is _MISSING else v for v in col)
            cols[name] = np.array(col, np.float64)
        for name in INTS[kind]:
            null = NO_XID if name == "xid" else INT_MISSING
            col = by_name[name]
            if name in sparse:
                col = tuple(null if v is _MISSING or v is None else v for v in col)
            cols[name] = _int_column(col)
        if kind == "nic":
            ports = zip(by_name["device"], by_name["port"], strict=True)
            cols["port"] = self.tables.intern_all("ports", ports, lambda k: f"{k[0]}:{k[1]}")
            cols["state"] = self.tables.intern_all("states", by_name["state"])
        if kind == "step":
            cols["job"] = self.tables.intern_all("jobs", by_name["job"])
        # Types were proven per shape; finiteness is a value check, done on whole columns.
        finite = np.ones(len(rows), bool)
        for name in FLOATS[kind]:
            finite &= ~np.isinf(cols[name])
            nan = np.isnan(cols[name])
            if nan.any():  # NaN stands for "absent"; a NaN written in the record is bad
                present = np.array([v is not _MISSING for v in by_name[name]], bool)
                present &= np.array([v is not None for v in by_name[name]], bool)
                finite &= ~(nan & present)
        if not finite.all():
            bad["not_finite"] += int((~finite).sum())
            cols = {name: col[finite] for name, col in cols.items()}
        return cols


def _int_column(values: Sequence[int]) -> np.ndarray:
    try:
        return np.array(values, np.int64)
    except OverflowError:  # a counter beyond 64 bits: valid JSON, saturate it
        top, low = int(np.iinfo(np.int64).max), INT_MISSING + 1
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


def concat(frames: Sequence[Frame]) -> Frame:
    """Join frames (one per file) into one, merging their string tables."""
    if len(frames) == 1:  # nothing to merge: no copy (a pass over 100k GPUs reads one segment)
        return frames[0]
    out = Frame()
    tables: dict[str, tuple[list[str], dict[str, int]]] = {
        t: (getattr(out, t), {}) for t in ("nodes", "jobs", "ports", "states")
    }
    parts: dict[str, list[dict[str, np.ndarray]]] = {k: [] for k in schema.KINDS}
    for frame in frames:
        maps = {t: _remap(tables[t][0], getattr(frame, t), tables[t][1]) for t in tables}
        for kind, cols in frame.cols.items():
            if not cols["ts"].size:
                continue
            cols = dict(cols)
            cols["node"] = maps["nodes"][cols["node"]]
            if kind == "step":
                cols["job"] = maps["jobs"][cols["job"]]
            if kind == "nic":
                cols["port"] = maps["ports"][cols["port"]]
                known = cols["state"] >= 0
                state = np.full(cols["state"].shape, -1, np.int32)
                state[known] = maps["states"][cols["state"][known]]
                cols["state"] = state
            parts[kind].append(cols)
        out.bad.update(frame.bad)
        out.files += frame.files
        out.lines += frame.lines
    for kind, pieces in parts.items():
        if pieces:
            out.cols[kind] = {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}
    return out


def select(frame: Frame, start: float, end: float) -> Frame:
    """The records with ``start <= ts <= end`` (tables and input counts kept)."""
    out = Frame(
        nodes=frame.nodes,
        jobs=frame.jobs,
        ports=frame.ports,
        states=frame.states,
        bad=frame.bad,
        files=frame.files,
        lines=frame.lines,
    )
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
