"""Reading telemetry for the analyzer: which files, and where each segment's records are read from.

A closed segment (:mod:`guardctl.storage.closed`) is read from its Parquet files. The
files of an open segment are read from their column mirrors where usable, and parsed
where not (JSON Lines costs about 3 us a record to parse). The writers only append, so
bytes a file gained after its segment was closed are read past what the segment holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from guardctl.analyze import mirrors
from guardctl.analyze.frame import Builder, Frame, Parser, concat, cut
from guardctl.errors import InputError
from guardctl.storage import layout, segments
from guardctl.telemetry import schema
from guardctl.telemetry.mirror import read_range

if TYPE_CHECKING:
    from guardctl.storage.closed import Manifest

# Below this many new bytes, worker processes cost more than they save.
_PARALLEL_BYTES = 16 << 20


def is_store(path: Path) -> bool:
    """Whether *path* is a store root (has telemetry/ or steps/) rather than plain files."""
    return path.is_dir() and any(p.is_dir() for p in layout.telemetry_inputs(path))


def _walk_jsonl(top: str) -> list[str]:
    """Every ``*.jsonl`` file under *top*, as os.walk finds them (symlinked dirs not followed).

    One scandir per directory and no stat at all (the entry type comes with the
    listing): a store of 100k GPUs has over 10,000 directories.
    """
    out: list[str] = []
    todo = [top]
    while todo:
        found = _list_dir(todo.pop())
        if found is not None:
            out.extend(found[0])
            todo.extend(found[1])
    return out


def _list_dir(directory: str) -> tuple[list[str], list[str]] | None:
    """One directory's ``*.jsonl`` files and subdirectories; None when it cannot be listed."""
    files: list[str] = []
    subdirs: list[str] = []
    try:
        entries = os.scandir(directory)
    except OSError:  # vanished or unreadable, as os.walk skips it
        return None
    with entries:
        for entry in entries:
            name = entry.name
            if name.endswith(".jsonl"):  # by far the most entries: decided by name alone
                if not entry.is_dir():
                    files.append(entry.path)
                continue
            if name.endswith(".cols"):  # column mirrors, found from their files
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir and not entry.is_symlink():
                subdirs.append(entry.path)
    return files, subdirs


@dataclass
class _Dir:
    """One directory as last listed, and since when it has looked the way it does."""

    stamp: tuple[int, int, int]  # inode, mtime and ctime (ns)
    seen: float  # monotonic time this stamp was first seen
    settled: bool  # listed at least SETTLE_S after that: a later change shows in the stamp
    listing: tuple[list[str], list[str]]


class Listing:
    """:func:`source_files` from pass to pass, listing again only directories that changed.

    A directory's entries change only with its modification time, but that time
    has a granularity (up to 2 s on some file systems): an entry made just after
    a listing, within the same tick, leaves the time as it was. So a listing is
    trusted while the time stays the same only when it was made ``SETTLE_S``
    after that time was first seen, or when the time (and the inode change time)
    lay ``OLD_S`` behind this machine's clock already (a file server's clock
    may be off by seconds, not by that much). Otherwise the directory is listed
    again. (Files that grow leave their directory's time alone: their growth is
    found by the reader's stat of each file.)

    A listing may keep only the files that can still matter to its passes (*since*): a
    store keeps weeks of closed segments, whose names (millions at a large site) only a
    cold pass needs, and it reads those segments from Parquet. A closed segment's own
    directory (``telemetry/<segment>/``) that ended before *since* is then not looked at.
    """

    SETTLE_S = 3.0
    OLD_S = 60.0

    def __init__(self) -> None:
        self._dirs: dict[str, _Dir] = {}
        self._files: list[str] | None = None
        self._keep: _Kept | None = None
        self.version = 0  # goes up whenever the list of files changed
        self.listed = 0  # directories listed by the last call (for tests)

    def files(self, path: Path, since: float | None = None) -> list[str]:
        """What ``source_files(path)`` returns now (the same list object while unchanged).
        With *since*, a directory listed now keeps out the files of closed segments that
        ended before it (files it kept when listed earlier stay until it is listed again)."""
        if not is_store(path):
            self._files, self._dirs = None, {}
            self.version += 1
            return source_files(path)
        now, wall = time.monotonic(), time.time()
        self._keep = _Kept(path, since) if since is not None else None
        dirs: dict[str, _Dir] = {}
        todo = [os.fspath(d) for d in layout.telemetry_inputs(path) if d.is_dir()]
        changed = self._files is None
        found: list[str] = []
        self.listed = 0
        while todo:
            directory = todo.pop()
            if self._keep is not None and self._keep.passes_over(directory):
                continue
            entry = self._visit(directory, now, wall)
            if entry is None:
                changed = True
                continue
            old = self._dirs.get(directory)
            changed = changed or old is None or old.listing != entry.listing
            dirs[directory] = entry
            found.extend(entry.listing[0])
            todo.extend(entry.listing[1])
        changed = changed or dirs.keys() != self._dirs.keys()
        self._dirs = dirs
        if changed or self._files is None:
            self._files = sorted(found)
            self.version += 1
        return self._files

    def forget(self) -> None:
        """List every directory again at the next call (the version goes on counting)."""
        self._dirs, self._files = {}, None

    def _visit(self, directory: str, now: float, wall: float) -> _Dir | None:
        try:
            st = os.stat(directory)  # before the listing: a change after it shows next time
        except OSError:
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        old = self._dirs.get(directory)
        if old is not None and old.stamp == stamp and old.settled:
            return old
        listing = _list_dir(directory)
        if listing is None:
            return None
        if self._keep is not None:
            listing = (self._keep.files(listing[0]), listing[1])
        self.listed += 1
        seen = old.seen if old is not None and old.stamp == stamp else now
        old_enough = wall - max(st.st_mtime, st.st_ctime) >= self.OLD_S
        return _Dir(stamp, seen, old_enough or now - seen >= self.SETTLE_S, listing)


class _Kept:
    """Which listed files a :class:`Listing` keeps: not those of closed segments that ended
    before *since* (which segments are closed: read once, when first needed)."""

    def __init__(self, root: Path, since: float) -> None:
        self.root, self.since = root, since
        self._closed: frozenset[str] | None = None

    def files(self, names: list[str]) -> list[str]:
        kept = []
        for name in names:
            bounds = segments.file_span(name)
            if bounds is None or bounds[1] >= self.since or not self._is_closed(name):
                kept.append(name)
        return kept

    def passes_over(self, directory: str) -> bool:
        """Whether *directory* is a closed segment's (``telemetry/<segment>/``) that ended
        before *since*: none of its files would be kept, so it is not even looked at."""
        name = layout.segment_directory(self.root, directory)
        if name is None:
            return False
        bounds = segments.span(name)
        return bounds is not None and bounds[1] < self.since and name in self._closed_names()

    def _is_closed(self, name: str) -> bool:
        return segments.segment_of(name) in self._closed_names()

    def _closed_names(self) -> frozenset[str]:
        if self._closed is None:
            self._closed = layout.closed_segments(self.root)
        return self._closed


def source_files(path: Path) -> list[str]:
    """The schema-v1 files to read under *path* (a store root, a directory or a file).

    Names are plain strings: a store of 100k GPUs holds over 100k files, where
    pathlib objects alone cost a good part of a pass.
    """
    try:
        if path.is_file():
            return [os.fspath(path)]
        if not path.is_dir():
            raise FileNotFoundError(str(path))
        tops = [path]
        if is_store(path):
            tops = [d for d in layout.telemetry_inputs(path) if d.is_dir()]
        return sorted(n for top in tops for n in _walk_jsonl(os.fspath(top)))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


def segment_groups(
    path: Path,
    *,
    closed_segments: bool = True,
    pick: Callable[[Collection[str]], Collection[str] | None] | None = None,
) -> dict[str, list[str]]:
    """The files under *path* by segment (:func:`source_files`), and in a store every closed
    segment besides: one whose JSON Lines raw retention removed (``guardctl store prune``)
    has no files here, and is read from its Parquet files alone.

    With *pick* (every segment's name -> those wanted; None: all), only the picked segments
    are returned, and a segment's directory of node files (``telemetry/<segment>/``) that
    was not picked is never listed: a store keeps a day of them, 12,500 files each at 100k
    GPUs, and a pass reads three or four."""
    if pick is None or not is_store(path):
        groups = segments.group_files(source_files(path))
        by_dir: dict[str, str] = {}
    else:
        groups, by_dir = _store_files(path)
    root = _closed_root(path, closed_segments)
    names = set(groups) | set(by_dir)
    if root is not None:
        names |= {n for n in layout.closed_segments(root) if segments.span(n) is not None}
    picked = names if pick is None else (pick(names) or names)
    out = {name: groups.get(name, []) for name in sorted(picked)}
    for name in picked:
        if name in by_dir:
            listed = _list_dir(by_dir[name])
            out[name] = sorted(out[name] + (listed[0] if listed is not None else []))
    return out


def _store_files(path: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """A store's files by segment, but for its segments' directories (segment -> directory),
    which are left unlisted."""
    files: list[str] = []
    by_dir: dict[str, str] = {}
    for top in layout.telemetry_inputs(path):
        listed = _list_dir(os.fspath(top))
        if listed is None:
            continue
        files += listed[0]
        for sub in listed[1]:
            name = layout.segment_directory(path, sub)
            if name is not None:
                by_dir[name] = sub
            else:  # a directory per node (earlier versions' agents) or per job: walked
                files += _walk_jsonl(sub)
    return segments.group_files(sorted(files)), by_dir


def _closed_root(path: Path, closed_segments: bool) -> Path | None:
    """*path* where its closed segments are to be read; None where none was closed (pyarrow
    then never loads: a command on another store does not pay for it)."""
    return path if closed_segments and layout.manifests_dir(path).is_dir() else None


@dataclass
class _Tail:
    """The bytes of one file not parsed yet."""

    path: str
    offset: int
    size: int


def _parse_tails(tails: Sequence[_Tail]) -> tuple[Frame, dict[str, int], dict[str, bool]]:
    """Parse each tail; return one frame, the new offsets and whether a line is pending."""
    parser = Parser()
    offsets, pending = {}, {}
    for tail in tails:
        try:
            data = read_range(tail.path, tail.offset, tail.size)
        except OSError:
            offsets[tail.path] = tail.offset  # vanished or unreadable: try again next pass
            pending[tail.path] = False
            continue
        # A last line without its newline is a write in progress (or cut short): it is
        # not consumed, so that a later pass reads it whole, and counted as truncated.
        end = data.rfind(b"\n") + 1
        parser.feed_lines(data[:end].splitlines())
        pending[tail.path] = bool(data[end:].strip())
        offsets[tail.path] = tail.offset + end
    frame = parser.frame()
    frame.files = len(tails)
    return frame, offsets, pending


def parse_tails(
    tails: Sequence[_Tail], workers: int
) -> tuple[Frame, dict[str, int], dict[str, bool]]:
    """:func:`_parse_tails`, split over worker processes when there is a lot to parse."""
    todo = sum(t.size - t.offset for t in tails)
    workers = min(workers, len(tails))
    if workers < 2 or todo < _PARALLEL_BYTES:
        return _parse_tails(tails)
    chunks = [list(tails[i::workers]) for i in range(workers)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_parse_tails, chunks))
    offsets: dict[str, int] = {}
    pending: dict[str, bool] = {}
    for _, off, pend in results:
        offsets.update(off)
        pending.update(pend)
    return concat([r[0] for r in results]), offsets, pending


# --- closed segments and the files of open ones -----------------------------------------------


def read_frame(
    path: Path,
    *,
    files: Sequence[str] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    since: float | None = None,
    until: float | None = None,
    closed_segments: bool = True,
    workers: int = 1,
    threads: int = 1,
    column_files: bool = True,
    keep_from: Mapping[str, float] | None = None,
    read_before: Sequence[Frame] = (),
) -> Frame:
    """Read the records under *path* that may fall in [since, until] into one frame
    (*workers* processes parse, *threads* threads decode the column mirrors); with
    *keep_from* (per kind), the records stamped before are let go as each part is read
    (:func:`guardctl.analyze.frame.cut`). Frames *read_before* (and emptied: see
    :func:`join`) are joined with what is read, in one copy.

    In a store, a closed segment (:mod:`guardctl.storage.closed`) is read from its Parquet
    files, plus whatever its JSON Lines gained since it was closed. The files of open
    segments (and of a closed one that no longer matches them) are read from their column
    mirrors (:mod:`guardctl.telemetry.mirror`) where usable, and only the bytes a mirror
    does not cover yet are parsed; files without one are parsed.

    What is read: *files*, or the segments of *groups* (files by segment, as
    :func:`segment_groups` gives them), or, without either, every file under *path* and
    every closed segment of the store, those whose JSON Lines are gone included.
    """
    if groups is None:
        if files is None:
            groups = segment_groups(path, closed_segments=closed_segments)
        else:
            groups = segments.group_files(files)
    if since is None and until is None:
        wanted = sorted(groups)
    else:
        wanted = segments.needed(groups, since, until)
    root = _closed_root(path, closed_segments)
    found = _held(root, wanted, groups)
    builder = Builder(_rows(read_before, [manifest for manifest, _ in found.values()]), threads)
    for part in read_before:
        _add(builder, part)
    tails: list[_Tail] = []
    todo: list[str] = []
    for name in wanted:
        segment = found.get(name)
        if root is None or segment is None or not _read_closed(builder, root, segment, keep_from):
            todo += groups[name]
            continue
        held = segment[1]
        tails += [_Tail(f, held[f], size) for f in groups[name] if (size := _size(f)) > held[f]]
        builder.out.files += sum(1 for f in groups[name] if held[f] == 0)  # not made from them
    if tails:  # bytes appended to a closed segment's files since it was closed
        late, _, pending = parse_tails(tails, workers)
        late.files = 0  # counted with the segment
        _count_pending(late, pending)
        _add(builder, _cut(late, keep_from))
    if todo:
        _add(builder, _read_files(todo, workers, threads, column_files, keep_from))
    return _whole(builder)


def _cut(frame: Frame, keep_from: Mapping[str, float] | None) -> Frame:
    return frame if keep_from is None else cut(frame, keep_from)


def _held(
    root: Path | None, wanted: Sequence[str], groups: Mapping[str, Sequence[str]]
) -> dict[str, tuple[Manifest, dict[str, int]]]:
    """The closed segments among *wanted* that match their files: their manifests, and how
    many bytes of each file they hold."""
    if root is None:
        return {}
    from guardctl.storage import closed

    found = {name: closed.held_by(root, name, groups[name]) for name in wanted}
    return {name: held for name, held in found.items() if held is not None}


def _read_closed(
    builder: Builder,
    root: Path,
    segment: tuple[Manifest, dict[str, int]],
    keep_from: Mapping[str, float] | None,
) -> bool:
    """Write a closed segment's records into *builder*; False when it cannot be read whole
    (its files are read instead)."""
    from guardctl.storage import closed

    return closed.read_whole(builder, root, segment[0], keep_from)


def _rows(parts: Sequence[Frame], manifests: Sequence[Manifest]) -> dict[str, int]:
    """Per kind, how many records *parts* hold and *manifests* say their segments hold."""
    return {
        kind: sum(p.count(kind) for p in parts) + sum(m.kinds.get(kind, 0) for m in manifests)
        for kind in schema.KINDS
    }


def _add(builder: Builder, part: Frame) -> None:
    """Write *part* into *builder* and empty it (its records are let go once written)."""
    if part.records_read:
        builder.add(part, consume=True)
    else:  # nothing read: its names stay out of the frame's tables
        builder.add_counts(part)
        part.cols = {}


def _whole(builder: Builder) -> Frame:
    """The builder's frame; a frame of nothing read (only input counts) when none was."""
    frame = builder.frame()
    if frame.records_read:
        return frame
    return Frame(bad=frame.bad, files=frame.files, lines=frame.lines)


def join(parts: Sequence[Frame], threads: int = 1) -> Frame:
    """One frame from every part, input counts summed; the parts are emptied of their records
    as they are joined."""
    builder = Builder(_rows(parts, []), threads)
    for part in parts:
        _add(builder, part)
    return _whole(builder)


def _read_files(
    files: Sequence[str],
    workers: int,
    threads: int,
    column_files: bool,
    keep_from: Mapping[str, float] | None = None,
) -> Frame:
    """Records of *files*, whole: from their column mirrors where usable, else parsed (less
    those before *keep_from*, let go as each part is read)."""
    parts: list[Frame] = []
    todo = list(files)
    if column_files:
        mirrored, todo = _read_mirrored(todo, workers, threads, keep_from)
        parts += mirrored
    if todo:
        parts.append(_cut(_parse_whole(todo, workers), keep_from))
    return join(parts)


def read_consumed(
    files: Sequence[str], workers: int, threads: int = 1
) -> tuple[Frame, dict[str, tuple[int, int]], dict[str, int]]:
    """Records of *files* (mirrors where usable), and per file how much was read: the bytes up
    to its last whole line, and its size then; and each file's inode. A last line still being
    written is neither read nor counted (whoever reads past the bytes read finds it)."""
    paths, sizes, inodes = _stat_all(files)
    found = mirrors.read_many(paths, sizes, inodes, threads)
    consumed: dict[str, tuple[int, int]] = {}
    tails = []
    for p, ok, covered, size in zip(paths, found.usable, found.covered, sizes, strict=True):
        start = covered if ok else 0
        consumed[p] = (start, size)
        if start < size:
            tails.append(_Tail(p, start, size))
    rest, offsets, _ = parse_tails(tails, workers)
    for p, offset in offsets.items():
        consumed[p] = (offset, consumed[p][1])
    frame = join([found.frame, rest])
    frame.files = len(paths)
    return frame, consumed, dict(zip(paths, inodes, strict=True))


def _stat_all(files: Sequence[str]) -> tuple[list[str], list[int], list[int]]:
    paths, sizes, inodes = [], [], []
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            continue  # vanished since it was listed
        paths.append(name)
        sizes.append(st.st_size)
        inodes.append(st.st_ino)
    return paths, sizes, inodes


def _read_mirrored(
    files: Sequence[str], workers: int, threads: int, keep_from: Mapping[str, float] | None
) -> tuple[list[Frame], list[str]]:
    """Records of *files* from their column mirrors, plus the bytes past what those cover.

    Returns the frames and the files without a usable mirror (to be parsed).
    """
    paths, sizes, inodes = _stat_all(files)
    found = mirrors.read_many(paths, sizes, inodes, threads, keep_from)
    tails = [
        _Tail(p, covered, size)
        for p, ok, covered, size in zip(paths, found.usable, found.covered, sizes, strict=True)
        if ok and covered < size
    ]
    rest, _, pending = parse_tails(tails, workers)  # written since the mirror's last batch
    rest.files = 0  # counted with the mirror
    _count_pending(rest, pending)
    _cut(rest, keep_from)
    unmirrored = [p for p, ok in zip(paths, found.usable, strict=True) if not ok]
    return [found.frame, rest], unmirrored


def _parse_whole(files: Sequence[str], workers: int) -> Frame:
    tails = [_Tail(str(f), 0, _size(f)) for f in files]
    frame, _, pending = parse_tails(tails, workers)
    _count_pending(frame, pending)
    frame.files = len(files)
    return frame


def _count_pending(frame: Frame, pending: dict[str, bool]) -> None:
    """A last line still being written counts as a truncated line (it is read next pass)."""
    waiting = sum(pending.values())
    if waiting:
        frame.bad["truncated"] += waiting
        frame.lines += waiting


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
