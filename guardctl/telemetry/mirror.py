"""Column mirrors: the format of ``<name>.cols``, and the writer that keeps one beside each file.

Schema-v1 JSON Lines stays the interchange format and the record of truth. Parsing
it costs about 3 us a record, which at 100k GPUs is most of an analysis pass, so
the writers (the node agent, the probe, ``guardctl simulate``) keep beside every
``<name>.jsonl`` a ``<name>.cols`` holding the same records, as the analyzer's own
parser reads them, in fixed-width binary rows that a reader loads with one copy
and turns into columns with a handful of numpy operations for thousands of
files at once (:mod:`guardctl.analyze.mirrors`). This module is plain Python
(no numpy): training ranks write mirrors too.

Layout: a 32-byte preamble (magic, row width, the fingerprint of the column
layout, the inode of the JSON Lines file it mirrors), then rows of
:data:`WIDTH` bytes. Every row starts with a kind byte:

- data rows (one per record): node (an index into the file's string table),
  timestamp, then one 8-byte slot per column of the kind, in the order of
  :mod:`guardctl.telemetry.columns` (floats as their bit patterns, integers,
  string-table indices);
- string rows: one entry of the file's string tables, numbered in order of
  first use, in chunks of ``WIDTH - 8`` bytes;
- mark rows, one after each batch: the rows since the previous mark mirror
  bytes [start, end) of the JSON Lines file, ``lines`` lines, and the sum of
  their 8-byte words and of the mark's start, end and lines (a checksum: a
  damaged mark is not trusted either);
- a stop row: nothing from ``start`` on is mirrored (a line the parser
  rejects); readers parse the rest themselves.

A reader trusts the rows up to the last mark of an unbroken chain from byte 0
whose checksums hold and that lies within the JSON Lines file, and parses the
rest of that file itself. A mirror whose magic, width, layout fingerprint,
inode or size does not fit is ignored: a mirror written under another column
layout is never misread. So a mirror is derived data: deleting one only makes
analysis slower, and a writer rebuilds the mirror of a file it opens, from the
file itself, so that it never extends a mirror it did not write.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from guardctl.telemetry import schema
from guardctl.telemetry.columns import (
    INT_MAX,
    INT_MISSING,
    LAYOUT,
    NO_XID,
    TABLE_OF,
    KindLayout,
    Layout,
)

try:  # the faster decoder where it is installed; json decides whatever it refuses
    import orjson

    _fast_loads: Any = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation
    _fast_loads = json.loads

log = logging.getLogger("guardctl.telemetry.mirror")

SUFFIX = ".cols"
# 2: the preamble carries the layout's fingerprint; 3: a mark's checksum covers its own slots
MAGIC = b"GCOLS\x00\x03\n"
PREAMBLE = struct.Struct("<8sIIQQ")  # magic, row width, reserved, layout fingerprint, inode
PREAMBLE_SIZE = PREAMBLE.size
HEAD = struct.Struct("<BBHid")  # kind, table, size, index (data rows: node), ts
MARK, STOP, STRING = 10, 11, 12
KIND_CODE = {kind: i + 1 for i, kind in enumerate(schema.KINDS)}
assert max(KIND_CODE.values()) < MARK
WIDTH = HEAD.size + 8 * LAYOUT.max_slots  # one width for every kind: all files in one buffer
CHUNK = WIDTH - 8  # bytes of a string per string row
_MASK = (1 << 64) - 1


def mirror_path(jsonl: str | os.PathLike[str]) -> str:
    """``<name>.cols`` for ``<name>.jsonl``."""
    text = os.fspath(jsonl)
    return (text[: -len(".jsonl")] if text.endswith(".jsonl") else text) + SUFFIX


def preamble(jsonl_ino: int, layout: Layout = LAYOUT) -> bytes:
    return PREAMBLE.pack(MAGIC, WIDTH, 0, layout.fingerprint, jsonl_ino)


def check_preamble(data: bytes | memoryview, jsonl_ino: int) -> bool:
    """Whether *data* starts a mirror of the JSON Lines file *jsonl_ino* under this layout."""
    if len(data) < PREAMBLE_SIZE:
        return False
    magic, width, _, fingerprint, ino = PREAMBLE.unpack_from(data)
    return (magic, width, fingerprint, ino) == (MAGIC, WIDTH, LAYOUT.fingerprint, jsonl_ino)


def checksum(rows: bytes | memoryview) -> int:
    """The sum of a batch's 8-byte words, wrapping, as a signed 64-bit number."""
    return _signed(sum(memoryview(rows).cast("Q")))


def mark_checksum(rows_sum: int, start: int, end: int, lines: int) -> int:
    """A mark's checksum: its batch's (:func:`checksum`) and its own slots', wrapping."""
    return _signed(rows_sum + start + end + lines)


def _signed(total: int) -> int:
    total &= _MASK
    return total - (1 << 64) if total >> 63 else total


# --- encoding --------------------------------------------------------------------------------


class _Missing:
    """Stands for a field absent from a record (``None`` is a null written in it)."""


_MISSING = _Missing()
_FLOAT_MAX = sys.float_info.max


class _Kind:
    """How one kind's validated records become rows."""

    def __init__(self, kind: str, code: int, kl: KindLayout) -> None:
        self.code = code
        self.keys = ("v", "ts", "node", *schema.FIELDS[kind])
        # Shapes (the type of every field, or absent) that schema.validate accepted: a
        # record of such a shape needs only the checks its types cannot express.
        self.good: set[tuple[type, ...]] = set()
        self.floats = kl.floats
        self.ints = kl.ints
        self.strings = tuple((c, TABLE_OF[c], kl.sources[c]) for c in kl.strings)
        pad = LAYOUT.max_slots - len(kl.slots)
        self.row = struct.Struct(
            f"<BBHid{len(kl.floats)}d{len(kl.ints) + len(kl.strings)}q{pad * 8}x"
        )


class Encoder:
    """Turns batches of lines into mirror rows, with one file's string tables.

    A record becomes exactly what the analyzer's parser makes of its line:
    :func:`schema.validate` decides what is accepted; absent numbers are NaN,
    absent integers :data:`INT_MISSING`, absent strings -1. A batch with a line
    the parser would reject, or a value the rows cannot hold as it would (an
    integer beyond 64 bits), is not encoded: the mirror stops there.
    """

    def __init__(self, layout: Layout = LAYOUT) -> None:
        self.layout = layout
        self.tables: dict[str, dict[str, int]] = {t: {} for t in layout.tables}
        self._table_no = {t: i for i, t in enumerate(layout.tables)}
        self._kinds = {k: _Kind(k, KIND_CODE[k], kl) for k, kl in layout.kinds.items()}

    def encode(self, lines: Iterable[bytes], start: int, end: int) -> bytes | None:
        """One batch's rows and its mark, or None when the rows cannot mirror it.

        The string tables are extended only when the batch encodes; the caller
        rolls them back (:meth:`snapshot`) if writing it fails.
        """
        saved = self.snapshot()
        strings: list[bytes] = []
        rows: list[bytes] = []
        count = 0
        try:
            for raw in lines:
                if not raw.strip():
                    continue  # the parser skips blank lines without counting them
                count += 1
                obj, checked = _decode(raw)
                rows.append(self._row(self._valid(obj, checked), strings))
        except (schema.BadRecord, OverflowError, ValueError, TypeError, struct.error):
            self.tables = saved
            return None
        body = b"".join(strings) + b"".join(rows)
        total = mark_checksum(checksum(body), start, end, count)
        mark = HEAD.pack(MARK, 0, 0, 0, 0.0) + struct.pack("<4q", start, end, count, total)
        return body + mark.ljust(WIDTH, b"\0")

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {t: dict(ids) for t, ids in self.tables.items()}

    def _valid(self, obj: Any, checked: bool) -> dict[str, Any]:
        """*obj* if the schema accepts it, else raise :class:`schema.BadRecord`.

        *checked*: decoded by orjson, which yields no NaN or infinite number.
        """
        name = obj.get("kind") if checked and type(obj) is dict else None
        kind = self._kinds.get(name) if type(name) is str else None
        if kind is None:
            return schema.validate(obj)
        values = tuple(map(obj.get, kind.keys, repeat(_MISSING)))
        shape = tuple(map(type, values))
        if shape not in kind.good:
            schema.validate(obj)
            kind.good.add(shape)
        elif values[0] != 1 or not values[2] or not 0 <= values[1] <= _FLOAT_MAX:
            return schema.validate(obj)  # raises, with the schema's own reason
        return obj  # (an integer beyond any float where a number goes fails float() below)

    def _row(self, record: dict[str, Any], strings: list[bytes]) -> bytes:
        kind = self._kinds[record["kind"]]
        get = record.get
        values: list[Any] = [math.nan if (v := get(n)) is None else float(v) for n in kind.floats]
        for name in kind.ints:
            v = get(name)
            if v is None:
                values.append(NO_XID if name == "xid" else INT_MISSING)
            elif INT_MISSING < v <= INT_MAX:
                values.append(int(v))
            else:  # the parser saturates a batch holding such a counter: not mirrored
                raise OverflowError(name)
        for col, table, sources in kind.strings:
            # one field, or several naming one thing: a NIC port is "<device>:<port>"
            text = get(col) if len(sources) == 1 else ":".join(str(record[s]) for s in sources)
            values.append(-1 if text is None else self._intern(table, text, strings))
        node = self._intern("nodes", record["node"], strings)
        return kind.row.pack(kind.code, 0, 0, node, float(record["ts"]), *values)

    def _intern(self, table: str, text: str, out: list[bytes]) -> int:
        ids = self.tables[table]
        index = ids.get(text)
        if index is None:
            index = ids[text] = len(ids)
            out.extend(string_rows(self._table_no[table], index, text))
        return index


def _decode(raw: bytes) -> tuple[Any, bool]:
    """The decoded line, and whether orjson decoded it (then no NaN or infinity is in it)."""
    try:
        return _fast_loads(raw), _fast_loads is not json.loads
    except ValueError:  # e.g. a lone surrogate escape, which json (and the schema) accept
        return json.loads(raw), False


def string_rows(table: int, index: int, text: str) -> list[bytes]:
    """The rows of one string-table entry."""
    data = text.encode("utf-8", "surrogatepass")
    out = []
    for lo in range(0, max(len(data), 1), CHUNK):
        part = data[lo : lo + CHUNK]
        out.append(struct.pack("<BBHi", STRING, table, len(part), index) + part.ljust(CHUNK, b"\0"))
    return out


def stop_row(start: int) -> bytes:
    return (HEAD.pack(STOP, 0, 0, 0, 0.0) + struct.pack("<q", start)).ljust(WIDTH, b"\0")


# --- the writer ------------------------------------------------------------------------------


@dataclass
class _Open:
    """A column file being appended to, and what it mirrors so far."""

    fd: int
    ino: int  # of the JSON Lines file, written in the preamble
    encoder: Encoder = field(default_factory=Encoder)
    end: int = 0  # bytes of the JSON Lines file mirrored
    stopped: bool = False


class Mirror:
    """Keeps the column files of the JSON Lines files one writer appends to.

    Never raises: a column file that cannot be written is given up for this
    process (analysis then parses the JSON Lines, as for any foreign file) and
    said once in the log.

    A mirror is rebuilt from its JSON Lines file when this writer first appends
    to that file (whatever was there, a predecessor's mirror, torn or not, or
    another layout's, is replaced). Not synced by default: the JSON Lines file
    is, and a mirror that lost its last batches in a crash of the machine is
    rebuilt by the next writer; one left with garbage fails its checksums and
    is not read.
    """

    def __init__(self, fsync: bool = False) -> None:
        self.fsync = fsync
        self._open: dict[str, _Open] = {}
        self._warned: set[str] = set()

    def append(self, jsonl: str | os.PathLike[str], start: int, data: bytes) -> None:
        """Mirror *data*, just appended (durably) to *jsonl* at byte *start*."""
        path = os.fspath(jsonl)
        try:
            self._append(path, start, data)
        except OSError as exc:
            self.forget(path)
            key = f"{type(exc).__name__}:{exc.errno}"
            if key not in self._warned:
                self._warned.add(key)
                log.warning("column file for %s not kept: %s", path, _describe(exc))

    def sync(self, jsonl: str | os.PathLike[str]) -> None:
        """Bring the mirror of *jsonl* up to the file's current end."""
        path = os.fspath(jsonl)
        self.append(path, os.stat(path).st_size, b"")

    def forget(self, jsonl: str | os.PathLike[str]) -> None:
        """Close the column file of *jsonl* (the writer is done with that file)."""
        state = self._open.pop(os.fspath(jsonl), None)
        if state is not None:
            os.close(state.fd)

    def close(self) -> None:
        for path in list(self._open):
            self.forget(path)

    def _append(self, path: str, start: int, data: bytes) -> None:
        state = self._open.get(path)
        if state is None:
            state = self._open[path] = _open_mirror(path)
        if state.stopped:
            return
        if state.end != start:  # new to this writer, or lines written past it: catch up
            if state.end > start:  # the file is not what was mirrored: start over
                _reset(state, path)
            self._write(state, read_range(path, state.end, start), state.end)
        if data and not state.stopped:
            self._write(state, data, start)

    def _write(self, state: _Open, data: bytes, start: int) -> None:
        saved = state.encoder.snapshot()
        rows = state.encoder.encode(data.splitlines(), start, start + len(data))
        stopped = rows is None
        if rows is None:
            rows = stop_row(start)
        size = os.fstat(state.fd).st_size
        if size == 0:
            rows = preamble(state.ino) + rows
        try:
            written = os.write(state.fd, rows)
            if written != len(rows):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(rows)} bytes)")
            if self.fsync:
                os.fsync(state.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(state.fd, size)
            state.encoder.tables = saved
            raise
        state.stopped = stopped
        state.end = start if stopped else start + len(data)


def _describe(exc: OSError) -> str:
    if exc.errno:
        return f"{errno.errorcode.get(exc.errno, 'error')} ({exc.strerror or exc})"
    return str(exc)


def read_range(path: str, start: int, end: int) -> bytes:
    """Bytes *start* to *end* of a file (a file object costs more than the read at 100k files)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts = []
        while start < end:
            chunk = os.pread(fd, end - start, start)
            if not chunk:  # cut short since it was stat'ed
                break
            parts.append(chunk)
            start += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _open_mirror(path: str) -> _Open:
    """Open the column file of *path*, emptied: this writer rebuilds it from the file."""
    st = os.stat(path)
    fd = os.open(mirror_path(path), os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return _Open(fd, st.st_ino)


def _reset(state: _Open, path: str) -> None:
    os.ftruncate(state.fd, 0)
    state.end, state.stopped = 0, False
    state.encoder = Encoder()
    state.ino = os.stat(path).st_ino
