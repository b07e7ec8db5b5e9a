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

from guardctl.analyze.frame import Builder, Frame, cut, newest_per_node
from guardctl.fileio import atomic_write
from guardctl.storage import layout
from guardctl.storage.arrow import pa, pc, pq
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


def frame_of(kind: str, table: pa.Table) -> Frame:
    """A frame holding one *kind*'s records from an Arrow table written by :func:`table_of`."""
    builder = Builder({kind: table.num_rows})
    _decode(builder, kind, table)
    return builder.frame()


def _decode(builder: Builder, kind: str, table: pa.Table) -> None:
    """Write the records of *table* (one *kind*'s, as :func:`table_of` writes them) into
    *builder*: each column copied once, straight from Arrow's buffers into its place."""
    into = builder.rows(kind, table.num_rows)
    jobs: list[tuple[np.ndarray, pa.ChunkedArray, list[np.ndarray] | int | None]] = []
    for name in ("ts", *FLOATS[kind]):
        jobs.append((into[name], table.column(name), None))
    for name in INTS[kind]:
        jobs.append((into[name], table.column(name), INT_MISSING))
    for name in ("node", *STRINGS[kind]):
        column = table.column(name)
        if not pa.types.is_dictionary(column.type):
            column = column.dictionary_encode()
        # where each chunk's names are in the frame's table (interned here, not in a thread)
        maps = [builder.names(TABLE_OF[name], c.dictionary.to_pylist()) for c in column.chunks]
        jobs.append((into[name], column, maps))
    builder.each(_fill, jobs)


def _fill(into: np.ndarray, column: pa.ChunkedArray, fill: list[np.ndarray] | int | None) -> None:
    """Copy *column* into *into*, a chunk at a time: a float's nulls as NaN, an integer's as
    *fill*; with maps (*fill*, one per chunk), a dictionary column's indices as they map
    into the frame's table (null: -1)."""
    at = 0
    for i, chunk in enumerate(column.chunks):
        end = at + len(chunk)
        if isinstance(fill, list):
            indices = chunk.indices
            indices = indices.fill_null(-1) if indices.null_count else indices
            np.take(fill[i], indices.to_numpy(), out=into[at:end])
        else:
            if fill is not None and chunk.null_count:
                chunk = chunk.fill_null(fill)
            into[at:end] = chunk.to_numpy(zero_copy_only=False)
        at = end


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
    included, as the JSON Lines' own reading would count them); with *keep_from*, less the
    records stamped before (see :func:`read_into`)."""
    builder = Builder(manifest.kinds)
    read_into(builder, root, manifest, since=since, until=until, keep_from=keep_from)
    return builder.frame()


def read_into(
    builder: Builder,
    root: Path,
    manifest: Manifest,
    *,
    since: float | None = None,
    until: float | None = None,
    keep_from: Mapping[str, float] | None = None,
) -> None:
    """Write the records of a closed segment into *builder* (see :func:`read`). With
    *keep_from* (per kind), the records stamped before are let go
    (:func:`guardctl.analyze.frame.cut`): never read where the manifest names each node's
    newest record (a kind's file none of whose row groups reaches that time is not read
    past its footer). Raises OSError, ValueError or ArrowException when the segment cannot
    be read whole (the builder's :meth:`~Builder.undo` forgets what was written)."""
    skip = keep_from is not None and manifest.newest is not None and since is None and until is None
    if keep_from is not None and not skip:  # every record read, then those before let go
        builder.add(cut(read(root, manifest, since, until), keep_from))
        return
    held = 0
    for kind, rows in manifest.kinds.items():
        if not rows or kind not in schema.KINDS:
            continue
        path = layout.parquet_path(root, kind, manifest.segment, manifest.start)
        low = keep_from.get(kind) if keep_from is not None else since
        held += _read_kind(builder, path, kind, rows, low, until)
    builder.add_counts(
        Frame(bad=Counter(manifest.bad), lines=manifest.lines, files=len(manifest.files))
    )
    if skip and manifest.newest is not None:
        # the records a kind's time filter left in the files, and each node's newest time
        # from the manifest (nodes none of whose records were read join the frame's table)
        builder.let_go(sum(manifest.kinds.values()) - held, manifest.newest)


def _read_kind(
    builder: Builder, path: Path, kind: str, rows: int, low: float | None, high: float | None
) -> int:
    """Write the records of one *kind*'s file of a closed segment stamped in [low, high] into
    *builder*, a row group at a time (Arrow's buffers hold one row group, and are used again
    for the next); a row group whose time range lies outside is not read. Returns how many
    records were written."""
    # straight from the pages' dictionaries into the frame's tables: no re-encoding
    with pq.ParquetFile(path, read_dictionary=["node", *STRINGS[kind]]) as file:
        meta = file.metadata
        if meta.num_rows != rows:
            # Not the file this manifest was written with (two compactions of a segment that
            # grew, their renames interleaved): the segment's files are read instead.
            raise ValueError(f"{path.name}: {kind} has {meta.num_rows} rows, not {rows}")
        ts = meta.schema.names.index("ts")
        bounded, written = low is not None or high is not None, 0
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(ts).statistics
            known = stats is not None and stats.has_min_max
            if known and _outside(stats, low, high):
                continue
            table = file.read_row_group(group)
            if bounded and not (known and _inside(stats, low, high)):  # (a filter copies all)
                table = table.filter(_within(low, high))
            _decode(builder, kind, table)
            written += table.num_rows
    return written


def _outside(stats: Any, low: float | None, high: float | None) -> bool:
    """Whether a row group's time statistics lie wholly outside [low, high]."""
    return (low is not None and stats.max < low) or (high is not None and stats.min > high)


def _inside(stats: Any, low: float | None, high: float | None) -> bool:
    """Whether a row group's time statistics lie wholly inside [low, high]."""
    return (low is None or stats.min >= low) and (high is None or stats.max <= high)


def _within(low: float | None, high: float | None) -> pc.Expression:
    """The records stamped in [low, high] (one bound may be None: none)."""
    ts = pc.field("ts")
    if low is None:
        return ts <= high
    return ts >= low if high is None else (ts >= low) & (ts <= high)


def read_held(
    root: Path, segment: str, files: Sequence[str], keep_from: Mapping[str, float] | None = None
) -> tuple[Frame, dict[str, int]] | None:
    """The records of closed *segment* (less those before *keep_from*, see :func:`read_into`)
    and how many bytes of each of *files* (its paths) it holds (:func:`covered`); None when
    the segment is not closed, no longer matches its files, or cannot be read: the files are
    read then."""
    found = held_by(root, segment, files)
    if found is None:
        return None
    builder = Builder(found[0].kinds)  # as long as the manifest says: no column made longer
    if not read_whole(builder, root, found[0], keep_from):
        return None
    return builder.frame(), found[1]


def held_by(
    root: Path, segment: str, files: Sequence[str]
) -> tuple[Manifest, dict[str, int]] | None:
    """Closed *segment*'s manifest and how many bytes of each of *files* it holds
    (:func:`covered`); None when the segment is not closed or no longer matches its files."""
    manifest = read_manifest(root, segment)
    if manifest is None:
        return None
    held = covered(root, manifest, files)
    return None if held is None else (manifest, held)


def read_whole(
    builder: Builder, root: Path, manifest: Manifest, keep_from: Mapping[str, float] | None
) -> bool:
    """:func:`read_into` *builder*; False, nothing written, when the segment cannot be read
    whole (half removed by retention, damaged)."""
    mark = builder.mark()
    try:
        read_into(builder, root, manifest, keep_from=keep_from)
    except (OSError, ValueError, KeyError, pa.ArrowException):
        builder.undo(mark)
        return False
    return True


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
