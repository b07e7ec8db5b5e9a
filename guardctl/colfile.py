"""Column files: a binary mirror of each telemetry file, so that analysis need not parse JSON.

Schema-v1 JSON Lines stays the interchange format and the record of truth. Parsing
it costs about 3 us a record, which at 100k GPUs is most of an analysis pass, so
the writers (the node agent, the probe, ``guardctl simulate``) keep beside every
``<name>.jsonl`` a ``<name>.cols`` holding the same records, as the analyzer's own
parser reads them, in fixed-width binary rows that a reader loads with one copy
and turns into columns with a handful of numpy operations for thousands of
files at once.

Layout: a 24-byte preamble (magic, row width, the inode of the JSON Lines file it
mirrors), then rows of 112 bytes (:data:`WIDTH`). Every row starts with a kind byte:

- data rows (gpu, host, nic, step): node (an index into the file's string table),
  timestamp, then one 8-byte slot per field, in the order of the analyzer's
  column lists (floats as their bit patterns, integers, string-table indices);
- string rows: one entry of the file's string tables (nodes, jobs, ports,
  states), numbered in order of first use, in chunks of 104 bytes;
- mark rows, one after each batch: the rows since the previous mark mirror
  bytes [start, end) of the JSON Lines file, ``lines`` lines, and the sum of
  their 8-byte words (a checksum);
- a stop row: nothing from ``start`` on is mirrored (a line the parser
  rejects); readers parse the rest themselves.

A reader trusts the rows up to the last mark of an unbroken chain from byte 0
whose checksums hold and that lies within the JSON Lines file, and parses the
rest of that file itself.
A mirror whose inode or size does not fit its JSON Lines file is ignored. So a
mirror is derived data: deleting one only makes analysis slower, and a writer
that finds its mirror behind the JSON Lines file (killed between the two
writes) parses the gap and catches up.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from guardctl import schema
from guardctl.analyze.frame import FLOATS, INTS, STRINGS, Frame, parse_lines

log = logging.getLogger("guardctl.colfile")

SUFFIX = ".cols"
MAGIC = b"GCOLS\x00\x02\n"  # 2: step rows carry samples and pp_stage
_PREAMBLE = struct.Struct("<8sIIQ")  # magic, row width, reserved, inode of the JSON Lines file
PREAMBLE_SIZE = _PREAMBLE.size
TABLES = ("nodes", "jobs", "ports", "states")

KIND_CODE = {"gpu": 1, "host": 2, "nic": 3, "step": 4}
MARK, STOP, STRING = 10, 11, 12
_VALID_KINDS = np.array([*KIND_CODE.values(), MARK, STOP, STRING], np.uint8)


def fields(kind: str) -> tuple[str, ...]:
    """The slots of a data row of *kind*, in order."""
    return (*FLOATS[kind], *INTS[kind], *STRINGS[kind])


_SLOTS = {kind: len(fields(kind)) for kind in schema.KINDS}
# One width for every file, so that a reader puts all files' rows in one buffer
# as it reads them (step rows leave half their slots empty: cheaper than a copy).
WIDTH = 16 + 8 * max(_SLOTS.values())


def row_dtype(width: int) -> np.dtype[np.void]:
    return np.dtype(
        [
            ("kind", "u1"),
            ("table", "u1"),  # string rows: which table
            ("size", "<u2"),  # string rows: bytes of this chunk
            ("idx", "<i4"),  # data rows: node; string rows: the entry's index
            ("ts", "<f8"),
            ("slots", "<i8", ((width - 16) // 8,)),
        ]
    )


def mirror_path(jsonl: str | os.PathLike[str]) -> str:
    """``<name>.cols`` for ``<name>.jsonl``."""
    text = os.fspath(jsonl)
    return (text[: -len(".jsonl")] if text.endswith(".jsonl") else text) + SUFFIX


# --- encoding (writers) ----------------------------------------------------------------------


@dataclass
class _FileTables:
    """The string tables of one column file: text -> index, in order of first use."""

    ids: dict[str, dict[str, int]] = field(default_factory=lambda: {t: {} for t in TABLES})


def _string_rows(table: int, index: int, text: str) -> list[bytes]:
    data = text.encode("utf-8", "surrogatepass")
    chunk = WIDTH - 8
    out = []
    for lo in range(0, max(len(data), 1), chunk):
        part = data[lo : lo + chunk]
        head = struct.pack("<BBHi", STRING, table, len(part), index)
        out.append(head + part.ljust(chunk, b"\0"))
    return out


def encode(frame: Frame, tables: _FileTables, start: int, end: int) -> bytes | None:
    """One batch's rows and its mark, or None when the rows cannot mirror it.

    *tables* is the file's string tables, extended here (callers keep a copy
    to roll back if the write fails).
    """
    if frame.bad:
        return None  # rejected lines: only the JSON Lines file tells what they were
    out: list[bytes] = []
    maps: dict[str, np.ndarray] = {}
    for t, table in enumerate(TABLES):
        ids = tables.ids[table]
        local = []
        for text in getattr(frame, table):
            index = ids.get(text)
            if index is None:
                index = ids[text] = len(ids)
                out.extend(_string_rows(t, index, text))
            local.append(index)
        maps[table] = np.array([*local, -1], np.int64)  # index -1 (absent) stays -1
    dtype = row_dtype(WIDTH)
    for kind, code in KIND_CODE.items():
        cols = frame.cols[kind]
        n = frame.count(kind)
        if not n:
            continue
        rows = np.zeros(n, dtype)
        rows["kind"] = code
        rows["idx"] = maps["nodes"][cols["node"]]
        rows["ts"] = cols["ts"]
        slots = rows["slots"]
        for j, name in enumerate(fields(kind)):
            col = cols[name]
            if name in STRINGS[kind]:
                slots[:, j] = maps[_TABLE_OF[name]][col]
            elif col.dtype == np.float64:
                slots[:, j] = col.view(np.int64)
            else:
                slots[:, j] = col
        out.append(rows.tobytes())
    mark = np.zeros(1, dtype)
    mark["kind"] = MARK
    body = b"".join(out)
    mark["slots"][0, :4] = (start, end, frame.lines, checksum(body))
    return body + mark.tobytes()


def checksum(rows: bytes | memoryview) -> int:
    """The sum of a batch's 8-byte words (wrapping): catches rows damaged on disk."""
    return int(np.frombuffer(rows, np.uint64).sum(dtype=np.uint64).view(np.int64))


_TABLE_OF = {"port": "ports", "state": "states", "job": "jobs"}


def _stop_row(start: int) -> bytes:
    row = np.zeros(1, row_dtype(WIDTH))
    row["kind"] = STOP
    row["slots"][0, 0] = start
    return row.tobytes()


@dataclass
class _Open:
    """A column file being appended to, and what it mirrors so far."""

    fd: int
    ino: int  # of the JSON Lines file, written in the preamble
    tables: _FileTables = field(default_factory=_FileTables)
    end: int = 0  # bytes of the JSON Lines file mirrored
    stopped: bool = False


class Mirror:
    """Keeps the column files of the JSON Lines files one writer appends to.

    Never raises: a column file that cannot be written is given up for this
    process (analysis then parses the JSON Lines, as for any foreign file) and
    said once in the log.

    Not synced by default: the JSON Lines file is, and a mirror that lost its
    last batches in a crash of the machine is caught up by the next writer;
    one left with garbage fails its checksums and is not read.
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
        except (OSError, ValueError) as exc:
            self.forget(path)
            key = f"{type(exc).__name__}:{getattr(exc, 'errno', '')}"
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
        if state.end != start:  # behind (a crash between the writes) or not ours: catch up
            if state.end > start:
                _reset(state, path)
            gap = read_range(path, state.end, start)
            self._write(state, gap, state.end)
        if data:
            self._write(state, data, start)

    def _write(self, state: _Open, data: bytes, start: int) -> None:
        frame = parse_lines(data.splitlines())
        saved = {t: dict(ids) for t, ids in state.tables.ids.items()}
        rows = encode(frame, state.tables, start, start + len(data))
        if rows is None:
            rows, state.stopped = _stop_row(start), True
        size = os.fstat(state.fd).st_size
        if size == 0:
            rows = _PREAMBLE.pack(MAGIC, WIDTH, 0, state.ino) + rows
        try:
            written = os.write(state.fd, rows)
            if written != len(rows):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(rows)} bytes)")
            if self.fsync:
                os.fsync(state.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(state.fd, size)
            state.tables.ids = saved
            raise
        state.end = start + len(data) if not state.stopped else start


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno:
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
    """Open (or create) the column file of *path* and find how far it mirrors."""
    st = os.stat(path)
    fd = os.open(mirror_path(path), os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        state = _Open(fd, st.st_ino)
        data = read_range(mirror_path(path), 0, os.fstat(fd).st_size)
        found = read_one(data, st.st_size, st.st_ino)
        if found is None:
            os.ftruncate(fd, 0)  # not a mirror of this file (or of nothing yet): start over
            return state
        state.end, state.stopped = found.covered, found.stopped
        state.tables.ids = {t: {s: i for i, s in enumerate(found.strings[t])} for t in TABLES}
        os.ftruncate(fd, PREAMBLE_SIZE + found.rows_used * WIDTH)  # drop a torn batch
        return state
    except BaseException:
        os.close(fd)
        raise


def _reset(state: _Open, path: str) -> None:
    os.ftruncate(state.fd, 0)
    state.end, state.stopped = 0, False
    state.tables = _FileTables()
    state.ino = os.stat(path).st_ino


# --- decoding (readers) ----------------------------------------------------------------------


@dataclass
class Found:
    """What one column file mirrors (for a writer reopening it)."""

    covered: int
    stopped: bool
    rows_used: int
    strings: dict[str, list[str]]


def read_one(data: bytes, jsonl_size: int, jsonl_ino: int) -> Found | None:
    """Decode one column file's bytes; None unless it is a mirror of that JSON Lines file."""
    width = _check_preamble(data, jsonl_ino)
    if width is None:
        return None
    n = (len(data) - PREAMBLE_SIZE) // width  # a torn last row is not read
    body = np.frombuffer(data, np.uint8, n * width, PREAMBLE_SIZE)
    result = _decode(body, [n], [jsonl_size])
    if not result.usable[0]:
        return None
    return Found(
        int(result.covered[0]),
        bool(result.stopped[0]),
        int(result.rows_used[0]),
        {t: list(result.frame_tables[t]) for t in TABLES},
    )


def _check_preamble(data: bytes | memoryview, jsonl_ino: int) -> int | None:
    if len(data) < PREAMBLE_SIZE:
        return None
    magic, width, _, ino = _PREAMBLE.unpack_from(data)
    if magic != MAGIC or width != WIDTH or ino != jsonl_ino:
        return None
    return int(width)


@dataclass
class Mirrored:
    """What the column files of many JSON Lines files hold.

    ``usable[i]``: file *i* has a mirror; its records up to byte ``covered[i]``
    are in ``frame`` (the rest of the file is the caller's to parse).
    """

    frame: Frame
    usable: list[bool]
    covered: list[int]


@dataclass
class _Decoded:
    cols: dict[str, dict[str, np.ndarray]]
    frame_tables: dict[str, list[str]]
    usable: np.ndarray
    covered: np.ndarray
    stopped: np.ndarray
    rows_used: np.ndarray
    lines: int


def _decode(buf: np.ndarray, counts_per_file: Sequence[int], sizes: Sequence[int]) -> _Decoded:
    """Decode the rows of several column files, laid end to end in *buf* (bytes)."""
    nfiles = len(counts_per_file)
    rows = buf.view(row_dtype(WIDTH))
    counts = np.array(counts_per_file, np.int64)
    first = np.zeros(nfiles, np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    file_of = np.repeat(np.arange(nfiles), counts)
    pos = np.arange(rows.size)
    kind = rows["kind"]
    limit = first + counts  # rows from here on are not used
    invalid = ~np.isin(kind, _VALID_KINDS)
    if invalid.any():  # a zeroed or foreign tail: the file ends at its first such row
        np.minimum.at(limit, file_of[invalid], pos[invalid])
    usable = np.ones(nfiles, bool)
    covered, stopped, used_end, lines = _chain(
        rows, kind, file_of, pos, first, limit, np.array(sizes, np.int64), usable
    )
    used = pos < used_end[file_of]
    strings = _strings(rows, kind, file_of, used, usable)
    cols, tables = _columns(rows, kind, file_of, used, strings, usable)
    covered[~usable] = 0
    return _Decoded(cols, tables, usable, covered, stopped, used_end - first,
                    int(lines[usable].sum()))  # fmt: skip


def _chain(
    rows: np.ndarray,
    kind: np.ndarray,
    file_of: np.ndarray,
    pos: np.ndarray,
    first: np.ndarray,
    limit: np.ndarray,
    sizes: np.ndarray,
    usable: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per file: bytes mirrored, stopped, the end of the rows used, lines mirrored."""
    nfiles = first.size
    marks = np.flatnonzero(((kind == MARK) | (kind == STOP)) & (pos < limit[file_of]))
    mfile = file_of[marks]
    slots = rows["slots"][marks]
    start, end, count = slots[:, 0], slots[:, 1].copy(), slots[:, 2]
    # Each batch's rows run from the row after the file's previous mark to its own mark.
    words = (
        rows.view(np.uint64)
        .reshape(rows.size, rows.dtype.itemsize // 8)
        .sum(axis=1, dtype=np.uint64)
    )
    running = np.zeros(rows.size + 1, np.uint64)
    np.cumsum(words, dtype=np.uint64, out=running[1:])
    stop = kind[marks] == STOP
    end[stop] = start[stop]
    new_file = np.ones(marks.size, bool)
    new_file[1:] = mfile[1:] != mfile[:-1]
    prev_end = np.zeros(marks.size, np.int64)
    prev_end[1:] = end[:-1]
    prev_end[new_file] = 0
    after_stop = np.zeros(marks.size, bool)
    after_stop[1:] = stop[:-1]
    after_stop[new_file] = False
    batch_start = np.empty(marks.size, np.int64)
    batch_start[1:] = marks[:-1] + 1
    batch_start[new_file] = first[mfile[new_file]]
    sums = (running[marks] - running[batch_start]).view(np.int64)
    ok = (start == prev_end) & (end >= start) & ~after_stop & (count >= 0)
    ok &= stop | (sums == slots[:, 3])
    if (~ok).any():  # the chain breaks: later batches of that file are not trusted
        np.minimum.at(limit, mfile[~ok], marks[~ok])
    good = marks < limit[mfile]
    ahead = good & (end > sizes[mfile])
    usable[np.unique(mfile[ahead])] = False  # a mirror of a longer file: not of this one
    last = np.full(nfiles, -1, np.int64)
    np.maximum.at(last, mfile[good], marks[good])
    covered = np.zeros(nfiles, np.int64)
    has = last >= 0
    covered[has] = rows["slots"][last[has], 1]
    stopped = np.zeros(nfiles, bool)
    stopped[has] = kind[last[has]] == STOP
    covered[stopped] = rows["slots"][last[stopped], 0]
    used_end = np.where(has, last + 1, first)
    lines = np.bincount(mfile[good & ~stop], weights=count[good & ~stop], minlength=nfiles)
    return covered, stopped, used_end, lines.astype(np.int64)


@dataclass
class _Strings:
    """Every used file's string tables, merged: file f's entry i of table t is
    ``tables[t][ids[t][base[t][f] + i]]`` (i below ``count[t][f]``)."""

    tables: dict[str, list[str]]
    ids: dict[str, np.ndarray]
    base: dict[str, np.ndarray]
    count: dict[str, np.ndarray]


def _strings(
    rows: np.ndarray,
    kind: np.ndarray,
    file_of: np.ndarray,
    used: np.ndarray,
    usable: np.ndarray,
) -> _Strings:
    """The string tables of the used rows, each distinct text decoded once.

    Merged tables list each text once, in order of first use over the files.
    A file whose entries are not numbered 0, 1, 2... in order is not a mirror.
    """
    which = np.flatnonzero(used & (kind == STRING))
    width = rows.dtype.itemsize
    chunk = width - 8
    sub = rows[which]
    table, size, index = sub["table"], sub["size"], sub["idx"].astype(np.int64)
    files = file_of[which]
    broken = (table >= len(TABLES)) | (size > chunk)
    usable[files[broken]] = False
    if (size == chunk).any():  # a string that may go on in the next row: the slow way
        return _strings_chunked(rows, which, table, size, index, files, usable)
    # Entries of each file and table in order; their numbers must run 0, 1, 2...
    order = np.lexsort((which, table, files))
    f_sorted, t_sorted = files[order], table[order]
    first = np.ones(order.size, bool)
    first[1:] = (f_sorted[1:] != f_sorted[:-1]) | (t_sorted[1:] != t_sorted[:-1])
    at = np.arange(order.size)
    rank = at - np.maximum.accumulate(np.where(first, at, 0))
    usable[f_sorted[index[order] != rank]] = False
    # Distinct texts (table, length, bytes), decoded once each.
    keys = np.zeros(which.size, [("t", "u1"), ("n", "<u2"), ("p", f"V{chunk}")])
    keys["t"], keys["n"] = table, size
    keys["p"] = rows.view(f"V{width}")[which].view([("h", "V8"), ("p", f"V{chunk}")])["p"]
    uniq, first_use, inverse = np.unique(keys, return_index=True, return_inverse=True)
    gid = np.zeros(uniq.size, np.int64)
    tables: dict[str, list[str]] = {t: [] for t in TABLES}
    for u in np.argsort(first_use, kind="stable").tolist():
        t, n = int(uniq["t"][u]), int(uniq["n"][u])
        if t >= len(TABLES):
            continue
        names = tables[TABLES[t]]
        gid[u] = len(names)
        names.append(bytes(uniq["p"][u])[:n].decode("utf-8", "surrogatepass"))
    row_gid = gid[inverse.ravel()]
    return _index(tables, row_gid[order], t_sorted, f_sorted, usable.size)


def _index(
    tables: dict[str, list[str]],
    gids: np.ndarray,
    table_of: np.ndarray,
    file_of: np.ndarray,
    nfiles: int,
) -> _Strings:
    """Per table: the global ids of each file's entries, given in (file, number) order."""
    ids, base, count = {}, {}, {}
    everyone = np.arange(nfiles)
    for t, name in enumerate(TABLES):
        mine = table_of == t
        ids[name] = gids[mine]
        owners = file_of[mine]
        base[name] = np.searchsorted(owners, everyone, "left")
        count[name] = np.searchsorted(owners, everyone, "right") - base[name]
    return _Strings(tables, ids, base, count)


def _strings_chunked(
    rows: np.ndarray,
    which: np.ndarray,
    table: np.ndarray,
    size: np.ndarray,
    index: np.ndarray,
    files: np.ndarray,
    usable: np.ndarray,
) -> _Strings:
    """:func:`_strings` for tables with long entries, spread over several rows."""
    width = rows.dtype.itemsize
    view = rows.view(np.uint8).data
    merged: dict[str, dict[str, int]] = {t: {} for t in TABLES}
    entries: list[tuple[int, int, int]] = []  # (file, table, global id), in order per file
    expected: dict[tuple[int, int], int] = {}
    text: list[bytes] = []
    current: tuple[int, int, int] | None = None  # (file, table, number) of the entry being read

    def finish() -> None:
        if current is not None:
            f, t, _ = current
            ids = merged[TABLES[t]]
            value = b"".join(text).decode("utf-8", "surrogatepass")
            entries.append((f, t, ids.setdefault(value, len(ids))))
            text.clear()

    found = zip(which.tolist(), table.tolist(), size.tolist(), index.tolist(), files.tolist(),
                strict=True)  # fmt: skip
    for at, t, n, number, f in found:
        if not usable[f]:
            continue
        payload = bytes(view[at * width + 8 : at * width + 8 + n])
        if current == (f, t, number):  # the next chunk of a long string
            text.append(payload)
            continue
        finish()
        current = None
        if number != expected.get((f, t), 0):
            usable[f] = False
            continue
        expected[(f, t)] = number + 1
        current = (f, t, number)
        text.append(payload)
    finish()
    entries.sort(key=lambda e: (e[0], e[1]))  # stable: numbers stay in order
    arr = np.array(entries, np.int64).reshape(-1, 3)
    tables = {t: list(merged[t]) for t in TABLES}
    return _index(tables, arr[:, 2], arr[:, 1], arr[:, 0], usable.size)


def _columns(
    rows: np.ndarray,
    kind: np.ndarray,
    file_of: np.ndarray,
    used: np.ndarray,
    strings: _Strings,
    usable: np.ndarray,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, list[str]]]:
    """Columns per kind with string indices into the merged tables."""
    # Rows as 8-byte words: word 0 holds kind and (upper half) the node, 1 the
    # timestamp, 2... the slots. Each kind's rows are gathered whole, in one
    # pass, and its columns are strided views of that block: one strided gather
    # per column, or a transposed copy, costs several times more.
    words = rows.view(np.int64).reshape(rows.size, rows.dtype.itemsize // 8)
    room = words.shape[1] - 2

    def pick(name: str) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
        at = np.flatnonzero(used & (kind == KIND_CODE[name]))
        if not at.size:
            return None
        if _SLOTS[name] > room:  # a kind this width cannot hold: not written by a writer
            usable[np.unique(file_of[at])] = False
            return None
        block = words[at]
        # Global string indices; one pointing outside its file's table: a damaged mirror.
        files = file_of[at]
        ids = {"node": _global(block[:, 0] >> 32, files, strings, "nodes", usable, absent=False)}
        for field_name in STRINGS[name]:
            local = block[:, 2 + fields(name).index(field_name)]
            ids[field_name] = _global(local, files, strings, _TABLE_OF[field_name], usable)
        return at, block, ids

    # Two kinds at a time: numpy lets go of the interpreter while it copies, and most of
    # the time is the kernel handing out (zeroing) fresh memory, which both cores can do.
    # (Marking a file unusable from either thread is the same write: no race to lose.)
    with ThreadPoolExecutor(2) as pool:
        found = dict(zip(KIND_CODE, pool.map(pick, KIND_CODE), strict=True))
    picked = {name: got for name, got in found.items() if got is not None}
    cols: dict[str, dict[str, np.ndarray]] = {}
    for name, (at, block, ids) in picked.items():
        keep = usable[file_of[at]]
        if not keep.all():  # files found damaged above: their rows go
            block, ids = block[keep], {k: v[keep] for k, v in ids.items()}
        out: dict[str, np.ndarray] = {"ts": block[:, 1].view(np.float64), "node": ids["node"]}
        for j, field_name in enumerate(fields(name)):
            if field_name in ids:
                out[field_name] = ids[field_name]
            elif field_name in FLOATS[name]:
                out[field_name] = block[:, 2 + j].view(np.float64)
            else:
                out[field_name] = block[:, 2 + j]
        cols[name] = out
    return cols, strings.tables


def _global(
    local: np.ndarray,
    files: np.ndarray,
    strings: _Strings,
    table: str,
    usable: np.ndarray,
    absent: bool = True,
) -> np.ndarray:
    """File-local string indices as indices into the merged table (-1: absent, kept)."""
    local = local.astype(np.int64, copy=False)
    bad = (local < (-1 if absent else 0)) | (local >= strings.count[table][files])
    if bad.any():
        usable[np.unique(files[bad])] = False
        local = np.where(bad, -1, local)
    lut = np.append(strings.ids[table], -1)  # index -1 (absent) stays -1
    index = np.where(local >= 0, strings.base[table][files] + local, -1)
    return lut[index].astype(np.int32)


def read_many(paths: Sequence[str], sizes: Sequence[int], inodes: Sequence[int]) -> Mirrored:
    """The records the column files of *paths* (JSON Lines files of those sizes and inodes) hold.

    A file without a usable mirror is marked so (the caller parses it whole).
    """
    reader = _Reader(sum(sizes))
    for i, path in enumerate(paths):
        reader.read(i, mirror_path(path), inodes[i])
    usable = [False] * len(paths)
    covered = [0] * len(paths)
    if not reader.files:
        return Mirrored(Frame(), usable, covered)
    decoded = _decode(reader.rows(), reader.counts, [sizes[i] for i in reader.files])
    for j, index in enumerate(reader.files):
        usable[index] = bool(decoded.usable[j])
        covered[index] = int(decoded.covered[j])
    t = decoded.frame_tables
    frame = Frame(nodes=t["nodes"], jobs=t["jobs"], ports=t["ports"], states=t["states"])
    for kind, cols in decoded.cols.items():
        frame.cols[kind] = cols
    frame.lines = decoded.lines
    frame.files = int(decoded.usable.sum())
    return Mirrored(frame, usable, covered)


class _Reader:
    """Reads column files end to end into one buffer, each with one system call.

    The preamble goes to a small buffer of its own and the rows straight to
    their place (a scattering read), so that no file's bytes are copied twice.
    """

    def __init__(self, expected: int) -> None:
        # A mirror is smaller than the file it mirrors: the JSON Lines' size is
        # room enough, and pages never written are never really allocated.
        self.buf = np.empty(expected + (1 << 20), np.uint8)
        self.view = self.buf.data
        self.head = memoryview(bytearray(PREAMBLE_SIZE))
        self.end = 0
        self.files: list[int] = []
        self.counts: list[int] = []

    def read(self, index: int, path: str, jsonl_ino: int) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            n = os.preadv(fd, [self.head, self.view[self.end :]], 0)
            while n - PREAMBLE_SIZE >= self.buf.size - self.end:  # may hold more: grow, again
                self._grow()
                n = os.preadv(fd, [self.head, self.view[self.end :]], 0)
        except OSError:
            return
        finally:
            os.close(fd)
        if n < PREAMBLE_SIZE or _check_preamble(self.head, jsonl_ino) is None:
            return  # (a shorter file leaves part of the last file's preamble in the buffer)
        count = (n - PREAMBLE_SIZE) // WIDTH  # a torn last row is not read
        self.files.append(index)
        self.counts.append(count)
        self.end += count * WIDTH

    def _grow(self) -> None:
        bigger = np.empty(self.buf.size * 2, np.uint8)
        bigger[: self.end] = self.buf[: self.end]
        self.view.release()
        self.buf, self.view = bigger, bigger.data

    def rows(self) -> np.ndarray:
        return self.buf[: self.end]


def verify(jsonl: str | os.PathLike[str]) -> str:
    """How the mirror of one JSON Lines file stands, for ``guardctl store check``.

    ``none`` (no mirror), ``ignored`` (not a mirror of this file), ``whole`` or
    ``partial`` (covers all or part of the file, and holds exactly what parsing
    that part gives), ``differs`` (it does not: a bug or an edited file).
    """
    path = os.fspath(jsonl)
    st = os.stat(path)
    if not os.path.exists(mirror_path(path)):
        return "none"
    found = read_many([path], [st.st_size], [st.st_ino])
    if not found.usable[0]:
        return "ignored"
    covered = found.covered[0]
    parsed = parse_lines(read_range(path, 0, covered).splitlines())
    if records(found.frame) != records(parsed):
        return "differs"
    return "whole" if covered == st.st_size else "partial"


def records(frame: Frame) -> dict[str, list[tuple[object, ...]]]:
    """Every record of *frame* as a tuple of values, string indices resolved, in order."""
    tables = {"node": frame.nodes, "job": frame.jobs, "port": frame.ports, "state": frame.states}
    out = {}
    for kind, cols in frame.cols.items():
        columns = []
        for name in sorted(cols):
            values = cols[name].tolist()
            if name in tables:
                values = [tables[name][i] if i >= 0 else None for i in values]
            elif cols[name].dtype == np.float64:  # NaN (absent) equal to NaN
                values = [None if v != v else v for v in values]
            columns.append(values)
        out[kind] = list(zip(*columns, strict=True))
    return out
