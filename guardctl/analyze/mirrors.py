"""Reading column mirrors (:mod:`guardctl.telemetry.mirror`) into frames, many files at once.

The writers keep a mirror beside each JSON Lines file; the analyzer reads the
mirrors of a pass into one buffer, a group of files at a time, and decodes each group
together with numpy: the chain of batch marks and their checksums, the string tables,
and the columns of every kind (:func:`read_many`). ``guardctl store check`` compares a
mirror with its file (:func:`verify`). A mirror that does not hold is never
misread: its file is parsed instead.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from guardctl.analyze.frame import Frame, concat, cut, parse_lines
from guardctl.telemetry.columns import LAYOUT, TABLE_OF, TABLES
from guardctl.telemetry.mirror import (
    KIND_CODE,
    MARK,
    PREAMBLE_SIZE,
    STOP,
    STRING,
    WIDTH,
    check_preamble,
    mirror_path,
    read_range,
)

_VALID_KINDS = np.array([*KIND_CODE.values(), MARK, STOP, STRING], np.uint8)
_SLOTS = {kind: kl.slots for kind, kl in LAYOUT.kinds.items()}
# Rows of mirrors decoded together. The rows, and each kind's block gathered from them, are
# each larger than the columns kept: read whole, a pass would hold both for every file at
# once. A few files at a time, it holds the columns and the rows of a few hundred nodes,
# whose pages the next group reuses (docs/performance.md, "A cold pass over three windows").
CHUNK_BYTES = 32 << 20


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
class Decoded:
    """What :func:`decode` made of the rows of several mirrors (arrays: one entry per file)."""

    cols: dict[str, dict[str, np.ndarray]]
    frame_tables: dict[str, list[str]]
    usable: np.ndarray  # whether the file's rows are a mirror of it at all
    covered: np.ndarray  # bytes of the JSON Lines file its rows stand for
    stopped: np.ndarray  # whether it ends in a stop row (a line its writer rejected)
    rows_used: np.ndarray  # rows up to and with its last good mark
    lines: int


def decode(
    buf: np.ndarray,
    counts_per_file: Sequence[int],
    sizes: Sequence[int],
    threads: int = 1,
) -> Decoded:
    """Decode the rows of several mirrors, laid end to end in *buf* (bytes, preambles left out).

    *counts_per_file* gives each file's rows and *sizes* its JSON Lines file's size;
    *threads*: the threads that gather the columns, a record kind each at a time.
    The incremental analyzer hands in, per file, the rows read before (string rows and
    a mark standing for all of them) followed by the rows new since, so that a tail
    is checked and decoded exactly as the whole file would be.
    """
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
    cols, tables = _columns(rows, kind, file_of, used, strings, usable, threads)
    covered[~usable] = 0
    return Decoded(
        cols, tables, usable, covered, stopped, used_end - first, int(lines[usable].sum())
    )


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
    # A mark's checksum is its batch's words' and its own slots' (start, end, lines).
    sums = running[marks] - running[batch_start]
    sums += slots[:, :3].view(np.uint64).sum(axis=1, dtype=np.uint64)
    sums = sums.view(np.int64)
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
    first_use, inverse = _distinct(
        rows.view(np.uint64).reshape(rows.size, width // 8)[which], table, size
    )
    payload = rows.view(f"V{width}")[which].view([("h", "V8"), ("p", f"V{chunk}")])["p"]
    gid = np.zeros(first_use.size, np.int64)
    tables: dict[str, list[str]] = {t: [] for t in TABLES}
    for u in np.argsort(first_use, kind="stable").tolist():
        r = int(first_use[u])
        t, n = int(table[r]), int(size[r])
        if t >= len(TABLES):
            continue
        names = tables[TABLES[t]]
        gid[u] = len(names)
        names.append(bytes(payload[r])[:n].decode("utf-8", "surrogatepass"))
    row_gid = gid[inverse]
    return _index(tables, row_gid[order], t_sorted, f_sorted, usable.size)


# Odd multipliers of a string row's words (fixed: a hash, not a secret; any collision is
# caught below, and costs time, never truth).
_MIX = np.random.default_rng(0x5EED).integers(1, 2**63, WIDTH // 8, np.uint64) | np.uint64(1)


def _distinct(
    words: np.ndarray, table: np.ndarray, size: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct string rows by (table, length, payload words 1...): each one's first
    row, and each row's distinct one (numbered in the order of the rows' sort).

    Rows are told apart by a 64-bit hash of their words, then checked word for word
    against the first row of their hash; only a collision sorts the rows whole, which
    costs several times more (each row is a key of ``WIDTH`` bytes).
    """
    payload = words[:, 1:]
    with np.errstate(over="ignore"):  # the multiplications wrap around, as they should
        mixed = (payload * _MIX[: payload.shape[1]]).sum(axis=1, dtype=np.uint64)
        mixed += table.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        mixed += size.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
    _, first_use, inverse = np.unique(mixed, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    same = first_use[inverse]
    if (
        np.array_equal(payload, payload[same])
        and np.array_equal(table, table[same])
        and np.array_equal(size, size[same])
    ):
        return first_use, inverse
    chunk = payload.itemsize * payload.shape[1]
    keys = np.zeros(words.shape[0], [("t", "u1"), ("n", "<u2"), ("p", f"V{chunk}")])
    keys["t"], keys["n"] = table, size
    keys["p"] = np.ascontiguousarray(payload).view(f"V{chunk}").ravel()
    _, first_use, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first_use, inverse.ravel()


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

    found = zip(
        which.tolist(), table.tolist(), size.tolist(), index.tolist(), files.tolist(), strict=True
    )
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
    threads: int,
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
        if len(_SLOTS[name]) > room:  # a kind this width cannot hold: not written by a writer
            usable[np.unique(file_of[at])] = False
            return None
        block = words[at]
        # Global string indices; one pointing outside its file's table: a damaged mirror.
        files = file_of[at]
        ids = {"node": _global(block[:, 0] >> 32, files, strings, "nodes", usable, absent=False)}
        for field_name in LAYOUT.kinds[name].strings:
            local = block[:, 2 + _SLOTS[name].index(field_name)]
            ids[field_name] = _global(local, files, strings, TABLE_OF[field_name], usable)
        return at, block, ids

    # Several kinds at a time: numpy lets go of the interpreter while it copies, and most of
    # the time is the kernel handing out (zeroing) fresh memory, which every core can do.
    # (Marking a file unusable from any thread is the same write: no race to lose.)
    with ThreadPoolExecutor(threads) as pool:
        found = dict(zip(KIND_CODE, pool.map(pick, KIND_CODE), strict=True))
    picked = {name: got for name, got in found.items() if got is not None}
    cols: dict[str, dict[str, np.ndarray]] = {}
    for name, (at, block, ids) in picked.items():
        keep = usable[file_of[at]]
        if not keep.all():  # files found damaged above: their rows go
            block, ids = block[keep], {k: v[keep] for k, v in ids.items()}
        out: dict[str, np.ndarray] = {"ts": block[:, 1].view(np.float64), "node": ids["node"]}
        for j, field_name in enumerate(_SLOTS[name]):
            if field_name in ids:
                out[field_name] = ids[field_name]
            elif field_name in LAYOUT.kinds[name].floats:
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


def read_many(
    paths: Sequence[str],
    sizes: Sequence[int],
    inodes: Sequence[int],
    threads: int = 1,
    keep_from: Mapping[str, float] | None = None,
) -> Mirrored:
    """The records the column files of *paths* (JSON Lines files of those sizes and inodes) hold,
    decoded with *threads* threads; with *keep_from* (per kind), those stamped before are let
    go as each few files are decoded (:func:`guardctl.analyze.frame.cut`).

    The files are read and decoded a few at a time (:data:`CHUNK_BYTES` of rows) into
    columns of their own, which are joined at the end: the rows of every file and the
    columns gathered from them are never all in memory at once. A file without a usable
    mirror is marked so (the caller parses it whole).
    """
    usable = [False] * len(paths)
    covered = [0] * len(paths)
    reader = _Reader(min(sum(sizes), CHUNK_BYTES))
    parts: list[Frame] = []
    for i, path in enumerate(paths):
        reader.read(i, mirror_path(path), inodes[i])
        if reader.end >= CHUNK_BYTES:
            parts.append(_decode_read(reader, sizes, threads, usable, covered, keep_from))
            reader.clear()
    if reader.files:
        parts.append(_decode_read(reader, sizes, threads, usable, covered, keep_from))
    frame = concat(parts, consume=True) if parts else Frame()
    return Mirrored(frame, usable, covered)


def _decode_read(
    reader: _Reader,
    sizes: Sequence[int],
    threads: int,
    usable: list[bool],
    covered: list[int],
    keep_from: Mapping[str, float] | None,
) -> Frame:
    """The records of the files in *reader*, their columns copied out of its rows (so that
    neither the rows nor each kind's gathered block outlive this), and what each file's
    mirror covers, into *usable* and *covered*."""
    decoded = decode(reader.rows(), reader.counts, [sizes[i] for i in reader.files], threads)
    for j, index in enumerate(reader.files):
        usable[index] = bool(decoded.usable[j])
        covered[index] = int(decoded.covered[j])
    frame = Frame()
    for table in TABLES:
        setattr(frame, table, decoded.frame_tables[table])
    frame.cols.update(decoded.cols)
    if keep_from is not None:
        cut(frame, keep_from)
    frame.cols = {
        kind: {name: _own_pages(col) for name, col in cols.items()}
        for kind, cols in frame.cols.items()
    }
    frame.lines = decoded.lines
    frame.files = int(decoded.usable.sum())
    return frame


def _own_pages(col: np.ndarray) -> np.ndarray:
    """A copy of *col* in memory mapped for it alone, given back whole once it is let go.

    A piece of a few files' column is a few MiB, which malloc serves from its heap, and
    pieces freed there stay with the process: joining them would then hold every piece
    and the joined columns at once.
    """
    if not col.nbytes:
        return np.ascontiguousarray(col)
    out = np.frombuffer(mmap.mmap(-1, col.nbytes), col.dtype, col.size)
    out[:] = col
    return out


class RowBuffer:
    """One growing buffer that the rows of many mirrors are read into, and a preamble's room.

    A mirror is smaller than the file it mirrors: the JSON Lines' size is room
    enough, and pages never written are never really allocated.
    """

    def __init__(self, expected: int) -> None:
        self.buf = np.empty(expected + (1 << 20), np.uint8)
        self.view = self.buf.data
        self.head = memoryview(bytearray(PREAMBLE_SIZE))
        self.end = 0
        self.counts: list[int] = []

    def clear(self) -> None:
        """Empty, for the next files (the buffer's pages stay, already handed out)."""
        self.end = 0
        self.counts = []

    def _grow(self) -> None:
        bigger = np.empty(self.buf.size * 2, np.uint8)
        bigger[: self.end] = self.buf[: self.end]
        self.view.release()
        self.buf, self.view = bigger, bigger.data

    def rows(self) -> np.ndarray:
        return self.buf[: self.end]


class _Reader(RowBuffer):
    """Reads column files end to end into one buffer, each with one system call.

    The preamble goes to a small buffer of its own and the rows straight to
    their place (a scattering read), so that no file's bytes are copied twice.
    """

    def __init__(self, expected: int) -> None:
        super().__init__(expected)
        self.files: list[int] = []

    def clear(self) -> None:
        super().clear()
        self.files = []

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
        if n < PREAMBLE_SIZE or not check_preamble(self.head, jsonl_ino):
            return  # (a shorter file leaves part of the last file's preamble in the buffer)
        count = (n - PREAMBLE_SIZE) // WIDTH  # a torn last row is not read
        self.files.append(index)
        self.counts.append(count)
        self.end += count * WIDTH


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
    tables = {col: getattr(frame, table) for col, table in TABLE_OF.items()}
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
