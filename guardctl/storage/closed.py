"""Closed segments: a segment's records of every node, once nobody writes it, as Apache Parquet.

The node agents write each segment as JSON Lines, one file per node (the open form,
appended every few seconds). Once a segment has ended, :func:`compact` reads all of its
files once and writes its records as one Parquet file per record kind, laid out in
hive-style partitions::

    <root>/segments/kind=<kind>/date=<YYYY-MM-DD>/hour=<HH>/<segment>.parquet
    <root>/segments/_manifests/<segment>.json

so that any engine (DuckDB, polars, pandas, Spark, Trino) reads the store without
guardctl and skips what a query's time and kind exclude without opening it. Columns
are the schema's fields as the analyzer holds them (``ts`` in Unix seconds, names as
strings, a NIC port as ``"<device>:<port>"``; an absent field is null). Rows keep the
order the segment's files were read in, so a node's rows lie together and row-group
statistics skip the other nodes.

The manifest is written last: a segment is closed when its manifest exists. It records
how much of each file the segment was made from was read, and its size then; bytes
appended to a file afterwards (an agent writing out its backlog after an outage) are
read from that file past the recorded size, and a file that shrank makes the reader
fall back to the JSON Lines. Parquet files are written to a temporary name, fsynced and
renamed: after retention removes the JSON Lines, they are the only copy.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from guardctl.analyze.frame import Frame, concat, cut, newest_per_node
from guardctl.fileio import atomic_write
from guardctl.storage import layout
from guardctl.storage.arrow import pa, pq
from guardctl.telemetry import schema
from guardctl.telemetry.columns import FLOATS, INT_MISSING, INTS, STRINGS, TABLE_OF

MANIFEST_VERSION = 1
# Rows per row group: small enough that a query for a few nodes skips most of a segment.
ROW_GROUP = 1 << 17
COMPRESSION = "zstd"


@dataclass
class Manifest:
    """What one closed segment was made from, and what its files held besides good records."""

    segment: str
    start: float
    end: float
    # store-relative path -> (bytes read: up to the last whole line, size) when it was read
    files: dict[str, tuple[int, int]]
    kinds: dict[str, int]  # rows per kind written
    bad: Counter[str] = field(default_factory=Counter)
    lines: int = 0
    # store-relative path -> its inode when read: a file replaced whole (not appended to) is
    # not the one the segment was made from, however long (none in manifests from before)
    inodes: dict[str, int] = field(default_factory=dict)
    # node -> its newest record's time in the segment, any kind (None in manifests from
    # before): a reader that needs only the newer records reads only those, and still knows
    # where each node's records end
    newest: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "segment": self.segment,
            "start": self.start,
            "end": self.end,
            "files": {k: list(v) for k, v in self.files.items()},
            "kinds": self.kinds,
            "bad": dict(self.bad),
            "lines": self.lines,
            "inodes": self.inodes,
            **({} if self.newest is None else {"newest": self.newest}),
        }

    def same_file(self, name: str, st: os.stat_result) -> bool:
        """Whether *st* (a stat of file *name*, store-relative) is of the file the segment was
        made from: its inode, where recorded, is the same."""
        ino = self.inodes.get(name)
        return ino is None or ino == st.st_ino

    def holds_whole(self, name: str) -> bool:
        """Whether the segment was made from all of file *name* (store-relative), to its end:
        no line of it was still being written."""
        recorded = self.files.get(name)
        return recorded is not None and recorded[0] == recorded[1]

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Manifest:
        if obj.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest version {obj.get('version')!r}")
        return cls(
            segment=str(obj["segment"]),
            start=float(obj["start"]),
            end=float(obj["end"]),
            files={str(k): (int(v[0]), int(v[1])) for k, v in obj["files"].items()},
            kinds={str(k): int(v) for k, v in obj["kinds"].items()},
            bad=Counter({str(k): int(v) for k, v in obj["bad"].items()}),
            lines=int(obj["lines"]),
            inodes={str(k): int(v) for k, v in obj.get("inodes", {}).items()},
            newest=_newest(obj.get("newest")),
        )


def _newest(obj: Any) -> dict[str, float] | None:
    return None if obj is None else {str(k): float(v) for k, v in obj.items()}


def read_manifest(root: Path, segment: str) -> Manifest | None:
    """The manifest of a closed segment; None when the segment is not closed (or unreadable)."""
    try:
        return Manifest.from_dict(json.loads(layout.manifest_path(root, segment).read_bytes()))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def looked_at(root: Path, segment: str) -> float | None:
    """When closed *segment* was last closed or found as it was closed by the leader (its
    manifest's modification time, :func:`mark_looked`); None when it is not closed, or that
    cannot be read."""
    try:
        return layout.manifest_path(root, segment).stat().st_mtime
    except OSError:
        return None


def mark_looked(root: Path, segment: str, when: float) -> None:
    """Say on closed *segment*'s manifest (its modification time, the bytes unchanged) that
    the leader found it as it was closed at *when*: a leader taking over goes by it."""
    # A store this process may not write: the next leader looks again.
    with contextlib.suppress(OSError):
        os.utime(layout.manifest_path(root, segment), (when, when))


# --- a frame's kind as an Arrow table, and back ----------------------------------------------


def _strings(indices: np.ndarray, names: list[str]) -> pa.Array:
    """Table indices as a string column (-1: null). Plain strings, not an Arrow dictionary:
    Parquet dictionary-encodes the pages all the same (same size), and readers (pyarrow among
    them) skip row groups by the column's statistics only for a plain string column."""
    mask = indices < 0
    encoded = pa.DictionaryArray.from_arrays(
        pa.array(indices, pa.int32(), mask=mask if mask.any() else None),
        pa.array(names, pa.string()),
    )
    return encoded.dictionary_decode()


def table_of(frame: Frame, kind: str) -> pa.Table:
    """The records of one *kind* of *frame* as an Arrow table (absent values null)."""
    cols = frame.cols[kind]
    arrays: dict[str, pa.Array] = {
        "ts": pa.array(cols["ts"], pa.float64()),
        "node": _strings(np.asarray(cols["node"]), frame.nodes),
    }
    for name in FLOATS[kind]:
        arrays[name] = pa.array(cols[name], pa.float64(), from_pandas=True)  # NaN: null
    for name in INTS[kind]:
        values = np.asarray(cols[name])
        missing = values == INT_MISSING
        arrays[name] = pa.array(values, pa.int64(), mask=missing if missing.any() else None)
    for name in STRINGS[kind]:
        arrays[name] = _strings(np.asarray(cols[name]), getattr(frame, TABLE_OF[name]))
    return pa.table(arrays)


def _indices(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A dictionary-encoded (or plain string) column as table indices and the table."""
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return np.empty(0, np.int32), []
    names = column.chunk(0).dictionary.to_pylist()
    parts = [c.indices.fill_null(-1).to_numpy(zero_copy_only=False) for c in column.chunks]
    return np.concatenate(parts).astype(np.int32, copy=False), names


def frame_of(kind: str, table: pa.Table) -> Frame:
    """A frame holding one *kind*'s records from an Arrow table written by :func:`table_of`."""
    frame = Frame()
    cols: dict[str, np.ndarray] = {
        "ts": table.column("ts").to_numpy().astype(np.float64, copy=False)
    }
    for name in ("node", *STRINGS[kind]):
        indices, names = _indices(table.column(name))
        cols[name] = indices
        setattr(frame, TABLE_OF[name], names)
    for name in FLOATS[kind]:
        cols[name] = table.column(name).to_numpy().astype(np.float64, copy=False)
    for name in INTS[kind]:
        column = table.column(name).fill_null(INT_MISSING)
        cols[name] = column.to_numpy().astype(np.int64, copy=False)
    frame.cols[kind] = cols
    return frame


# --- writing and reading closed segments -----------------------------------------------------


class SegmentWriter:
    """Writes one closed segment a part at a time (memory bounded by the part), per kind one
    Parquet file under a temporary name; :meth:`finish` puts them in place, manifest last."""

    def __init__(self, root: Path, segment: str, start: float) -> None:
        self.root, self.segment, self.start = root, segment, start
        self.rows: Counter[str] = Counter()
        self.newest: dict[str, float] = {}
        self._writers: dict[str, tuple[pq.ParquetWriter, Path]] = {}

    def add(self, frame: Frame) -> None:
        for kind in schema.KINDS:
            if frame.count(kind):
                table = table_of(frame, kind)
                self._writer(kind, table.schema).write_table(table, row_group_size=ROW_GROUP)
                self.rows[kind] += frame.count(kind)
        per = newest_per_node(frame)
        if per is None:
            return
        for i in np.flatnonzero(np.isfinite(per)).tolist():
            name = frame.nodes[i]
            self.newest[name] = max(self.newest.get(name, -math.inf), float(per[i]))

    def _writer(self, kind: str, table_schema: pa.Schema) -> pq.ParquetWriter:
        if kind not in self._writers:
            path = layout.parquet_path(self.root, kind, self.segment, self.start)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            writer = pq.ParquetWriter(tmp, table_schema, compression=COMPRESSION)
            self._writers[kind] = (writer, tmp)
        return self._writers[kind][0]

    def finish(self, manifest: Manifest) -> None:
        """Close, sync and rename every kind's file, drop kinds no longer found, then write
        the manifest: until it is written, readers read the JSON Lines."""
        for kind in schema.KINDS:
            path = layout.parquet_path(self.root, kind, self.segment, self.start)
            if kind not in self._writers:
                path.unlink(missing_ok=True)  # a kind a rewrite no longer finds
                continue
            writer, tmp = self._writers.pop(kind)
            writer.close()
            _fsync(tmp)
            os.replace(tmp, path)
        manifest.kinds = dict(self.rows)
        manifest.newest = dict(sorted(self.newest.items()))
        layout.manifests_dir(self.root).mkdir(parents=True, exist_ok=True)
        body = json.dumps(manifest.to_dict()).encode()
        atomic_write(layout.manifest_path(self.root, self.segment), body, fsync=True)

    def abort(self) -> None:
        for writer, tmp in self._writers.values():
            with contextlib.suppress(Exception):
                writer.close()
            tmp.unlink(missing_ok=True)
        self._writers.clear()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(
    root: Path,
    manifest: Manifest,
    since: float | None = None,
    until: float | None = None,
    keep_from: Mapping[str, float] | None = None,
) -> Frame:
    """The records of a closed segment, those in [since, until] where given (input counts
    included, as the JSON Lines' own reading would count them). With *keep_from* (per kind),
    the records stamped before are let go (:func:`guardctl.analyze.frame.cut`): never read
    where the manifest names each node's newest record (a kind's file none of whose row
    groups reaches that time is not read past its footer)."""
    skip = keep_from is not None and manifest.newest is not None and since is None and until is None
    frames = []
    for kind, rows in manifest.kinds.items():
        if not rows or kind not in schema.KINDS:
            continue
        path = layout.parquet_path(root, kind, manifest.segment, manifest.start)
        low = keep_from.get(kind) if skip and keep_from is not None else since
        filters = _time_filter(low, until)
        table = pq.read_table(
            path,
            filters=filters,
            # straight from the pages' dictionaries into the frame's tables: no re-encoding
            read_dictionary=["node", *STRINGS[kind]],
        )
        written = table.num_rows if filters is None else pq.read_metadata(path).num_rows
        if written != rows:
            # Not the file this manifest was written with (two compactions of a segment that
            # grew, their renames interleaved): the segment's files are read instead.
            raise ValueError(f"{manifest.segment}: {kind} has {written} rows, not {rows}")
        frames.append(frame_of(kind, table))
    frame = concat(frames) if frames else Frame()
    frame.bad = Counter(manifest.bad)
    frame.lines = manifest.lines
    frame.files = len(manifest.files)
    if skip and manifest.newest is not None:
        _let_go(frame, manifest)
    elif keep_from is not None:
        cut(frame, keep_from)
    return frame


def _let_go(frame: Frame, manifest: Manifest) -> None:
    """Count the records a read with each kind's time filter left in the files, and take each
    node's newest time from the manifest (names of nodes none of whose records were read
    join the frame's table)."""
    assert manifest.newest is not None
    frame.let_go = sum(manifest.kinds.values()) - frame.records
    index = {name: i for i, name in enumerate(frame.nodes)}
    newest = np.full(len(frame.nodes) + len(manifest.newest), -np.inf)
    for name, ts in manifest.newest.items():
        i = index.get(name)
        if i is None:
            i = index[name] = len(frame.nodes)
            frame.nodes.append(name)
        newest[i] = ts
    frame.let_go_newest = newest[: len(frame.nodes)]


def _time_filter(since: float | None, until: float | None) -> list[tuple[str, str, float]] | None:
    clauses = []
    if since is not None:
        clauses.append(("ts", ">=", since))
    if until is not None:
        clauses.append(("ts", "<=", until))
    return clauses or None


def read_held(
    root: Path, segment: str, files: Sequence[str], keep_from: Mapping[str, float] | None = None
) -> tuple[Frame, dict[str, int]] | None:
    """The records of closed *segment* (less those before *keep_from*, see :func:`read`) and
    how many bytes of each of *files* (its paths) it holds (:func:`covered`); None when the
    segment is not closed, no longer matches its files, or cannot be read (half removed by
    retention, damaged): the files are read then."""
    manifest = read_manifest(root, segment)
    if manifest is None:
        return None
    held = covered(root, manifest, files)
    if held is None:
        return None
    try:
        return read(root, manifest, keep_from=keep_from), held
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return None


def covered(root: Path, manifest: Manifest, files: Sequence[str]) -> dict[str, int] | None:
    """How many bytes of each of *files* (paths of this segment) the closed segment holds: 0
    for a file it was not made from. None when a file it was made from is shorter now than
    what was read of it, or was replaced whole: the segment no longer matches its JSON Lines.
    Unless the segment outlived its files (:func:`outlived`): it is then the only copy of
    their records, and a file by one of their names (an agent's backlog, days late, or a
    node whose clock fell behind) is another file, read whole beside it."""
    out: dict[str, int] = {}
    only_copy = outlived(root, manifest, files)
    for name in files:
        rel = relative(root, name)
        recorded = manifest.files.get(rel)
        if recorded is None:
            out[name] = 0
            continue
        try:
            st = os.stat(name)
        except OSError:  # removed by retention: the segment holds it all
            out[name] = recorded[0]
            continue
        if st.st_size < recorded[0] or not manifest.same_file(rel, st):
            if not only_copy:
                return None
            out[name] = 0
            continue
        out[name] = recorded[0]
    return out


def is_current(root: Path, manifest: Manifest, files: Sequence[str]) -> bool:
    """Whether the closed segment was made from exactly *files* as they are now."""
    if len(files) != len(manifest.files):
        return False
    for name in files:
        rel = relative(root, name)
        recorded = manifest.files.get(rel)
        try:
            st = os.stat(name)
        except OSError:
            return False
        if recorded is None or st.st_size != recorded[1] or not manifest.same_file(rel, st):
            return False
    return True


def outlived(root: Path, manifest: Manifest, files: Sequence[str]) -> bool:
    """Whether a file the closed segment was made from is no longer among *files* (raw
    retention, ``guardctl store prune``, removed its JSON Lines): the segment is then the
    only copy of its records, never to be written again from the files that remain (what
    they gained since, and files it was not made from, are read past it)."""
    listed = {relative(root, name) for name in files}
    return any(name not in listed for name in manifest.files)


def relative(root: Path, name: str) -> str:
    prefix = os.fspath(root) + os.sep
    return name[len(prefix) :] if name.startswith(prefix) else name
