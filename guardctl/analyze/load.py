"""Reading telemetry for the analyzer: which files, and a columnar cache that parses each byte once.

Schema-v1 JSON Lines stays the interchange format. Parsing it is what costs
(about 3 us a record), so the analyzer keeps a derived, rebuildable journal
under ``<store>/cache/analyze/``: per hourly bucket, a manifest of how many
bytes of each source file were consumed, and segments of raw numpy columns
holding the records parsed from them, read straight into the joined arrays.
The writers only append, so a later pass parses just the new tails and adds
one segment; a file that shrank or was rewritten invalidates its hour, which is
then rebuilt. Deleting the cache is always safe.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guardctl import layout
from guardctl.analyze import mirrors
from guardctl.analyze.frame import Frame, Parser, assemble, concat
from guardctl.errors import InputError, StoreError
from guardctl.fileio import atomic_write, atomic_writer
from guardctl.telemetry.columns import TABLES
from guardctl.telemetry.mirror import read_range

try:  # the manifests are large JSON: the faster codec where it is installed
    import orjson

    _fast_dumps: Any = orjson.dumps
    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation
    _fast_dumps = None
    _loads = json.loads


def _dumps(obj: Any) -> bytes:
    if _fast_dumps is not None:
        try:
            return bytes(_fast_dumps(obj))
        except TypeError:  # a file name that is not UTF-8 (surrogate escapes): json copes
            pass
    return json.dumps(obj).encode()


# 2: segments are raw columns (.cols), not .npz; 3: agent records; 4: step samples, pp_stage
CACHE_VERSION = 4
_HOUR = re.compile(r"(?:^|[/.])(\d{8}T\d{2})\.jsonl$")
_NO_HOUR = "other"
_TAIL = len("20250101T00.jsonl")
_HOUR_TAILS: dict[str, str] = {}
# Clock skew between nodes: a record may sit in the neighbouring hour's file.
_SKEW_S = 900.0
_CACHE_ERRORS = (OSError, StoreError, ValueError, KeyError, TypeError)
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
    """

    SETTLE_S = 3.0
    OLD_S = 60.0

    def __init__(self) -> None:
        self._dirs: dict[str, _Dir] = {}
        self._files: list[str] | None = None
        self.version = 0  # goes up whenever the list of files changed
        self.listed = 0  # directories listed by the last call (for tests)

    def files(self, path: Path) -> list[str]:
        """What ``source_files(path)`` returns now (the same list object while unchanged)."""
        if not is_store(path):
            self._files, self._dirs = None, {}
            self.version += 1
            return source_files(path)
        now, wall = time.monotonic(), time.time()
        dirs: dict[str, _Dir] = {}
        todo = [os.fspath(d) for d in layout.telemetry_inputs(path) if d.is_dir()]
        changed = self._files is None
        found: list[str] = []
        self.listed = 0
        while todo:
            directory = todo.pop()
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
        self.listed += 1
        seen = old.seen if old is not None and old.stamp == stamp else now
        old_enough = wall - max(st.st_mtime, st.st_ctime) >= self.OLD_S
        return _Dir(stamp, seen, old_enough or now - seen >= self.SETTLE_S, listing)


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


def hour_of(path: str | Path) -> str:
    """The hourly bucket of a store file (from its name), or "other"."""
    text = os.fspath(path)
    # Most files of a store share a few name endings ("<hour>.jsonl"): remembered, they
    # spare a regular expression per file.
    hour = _HOUR_TAILS.get(text[-_TAIL:])
    if hour is not None and (len(text) == _TAIL or text[-_TAIL - 1] in "/."):
        return hour
    match = _HOUR.search(text)
    if match is None:
        return _NO_HOUR
    if match.end() == len(text) and len(_HOUR_TAILS) < 10_000:
        _HOUR_TAILS[text[-_TAIL:]] = match.group(1)
    return match.group(1)


def hour_start(hour: str) -> float | None:
    """When an hourly bucket begins (Unix seconds); None for files without a date."""
    if hour == _NO_HOUR:
        return None
    return float(calendar.timegm(time.strptime(hour, "%Y%m%dT%H")))


def hours_needed(hours: Sequence[str], since: float | None, until: float | None) -> list[str]:
    """The buckets that can hold records between *since* and *until* (None: open)."""
    keep = []
    for hour in sorted(set(hours)):
        start = hour_start(hour)
        if start is None:
            keep.append(hour)
            continue
        if since is not None and start + 3600 + _SKEW_S < since:
            continue
        if until is not None and start - _SKEW_S > until:
            continue
        keep.append(hour)
    return keep


def latest_hour_end(hours: Sequence[str], until: float | None = None) -> float | None:
    """The end of the newest dated bucket (to pick files before reading any), leaving out the
    buckets that start after *until* (now plus the tolerance): one record from a clock hours
    ahead must not move the window hours into the future, past everyone's data."""
    starts = [s for s in map(hour_start, hours) if s is not None and (until is None or s <= until)]
    return max(starts) + 3600 if starts else None


@dataclass
class _Tail:
    """The bytes of one file not parsed yet."""

    path: str
    key: str
    offset: int
    size: int
    mtime_ns: int


def _parse_tails(tails: Sequence[_Tail]) -> tuple[Frame, dict[str, int], dict[str, bool]]:
    """Parse each tail; return one frame, the new offsets and whether a line is pending."""
    parser = Parser()
    offsets, pending = {}, {}
    for tail in tails:
        try:
            data = read_range(tail.path, tail.offset, tail.size)
        except OSError:
            offsets[tail.key] = tail.offset  # vanished or unreadable: try again next pass
            pending[tail.key] = False
            continue
        # A last line without its newline is a write in progress (or cut short): it is
        # not consumed, so that a later pass reads it whole, and counted as truncated.
        end = data.rfind(b"\n") + 1
        parser.feed_lines(data[:end].splitlines())
        pending[tail.key] = bool(data[end:].strip())
        offsets[tail.key] = tail.offset + end
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


# --- the columnar journal -------------------------------------------------------------------


_SEG_MAGIC = b"guardctl-segment\n"


def _save_segment(path: Path, frame: Frame) -> None:
    """Write *frame* as one file: a JSON header (string tables, column layout), then raw columns.

    Raw columns, not a zip of .npy files: a pass reads every column of every
    segment straight into its place in the joined arrays, with no copy in between.
    """
    layout_: dict[str, Any] = {}
    arrays = []
    offset = 0
    for kind, cols in frame.cols.items():
        rows = int(cols["ts"].size)
        entry: dict[str, Any] = {"rows": rows, "cols": []}
        for name, col in cols.items():
            col = np.ascontiguousarray(col)
            entry["cols"].append([name, col.dtype.str, offset])
            offset += col.nbytes
            arrays.append(col)
        layout_[kind] = entry
    tables = {t: getattr(frame, t) for t in TABLES}
    header = json.dumps({"tables": tables, "kinds": layout_, "bytes": offset}).encode()
    # A cache: rebuilt from the raw files if a crash leaves it empty, so no fsync.
    with atomic_writer(path, fsync=False) as fh:
        fh.write(_SEG_MAGIC + len(header).to_bytes(8, "little") + header)
        for col in arrays:
            fh.write(col.data.cast("B"))


class Segment:
    """A stored segment, header read and size checked; its columns are read on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as fh:
            if fh.read(len(_SEG_MAGIC)) != _SEG_MAGIC:
                raise ValueError(f"{path}: not a segment")
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
            self.start = len(_SEG_MAGIC) + 8 + size
            if os.fstat(fh.fileno()).st_size != self.start + header["bytes"]:
                raise ValueError(f"{path}: cut short")
        tables = header["tables"]
        self.nodes: list[str] = tables["nodes"]
        self.jobs: list[str] = tables["jobs"]
        self.ports: list[str] = tables["ports"]
        self.states: list[str] = tables["states"]
        self.collectors: list[str] = tables["collectors"]
        self.errors: list[str] = tables["errors"]
        self.kinds: dict[str, Any] = header["kinds"]

    def count(self, kind: str) -> int:
        entry = self.kinds.get(kind)
        return int(entry["rows"]) if entry else 0

    def fill(self, kind: str, dests: dict[str, np.ndarray]) -> None:
        """Read this segment's columns of *kind* into *dests* (arrays of its row count)."""
        with open(self.path, "rb") as fh:
            for name, dtype, offset in self.kinds[kind]["cols"]:
                dest = dests[name]
                if np.dtype(dtype) != dest.dtype:
                    raise ValueError(f"{self.path}: {kind}.{name} is {dtype}")
                fh.seek(self.start + offset)
                view = dest.data.cast("B")
                if fh.readinto(view) != view.nbytes:
                    raise ValueError(f"{self.path}: cut short")


def _load_segment(path: Path) -> Frame:
    """One segment as a frame of its own."""
    return assemble([Segment(path)])


def _write_json(path: Path, obj: Any) -> None:
    # A manifest lists every file of its hour (100k entries); a cache, so no fsync.
    atomic_write(path, _dumps(obj), fsync=False)


class HourCache:
    """The cached segments and consumption manifest of one hourly bucket."""

    def __init__(self, root: Path, hour: str) -> None:
        self.dir = root / hour
        self.manifest_path = self.dir / "manifest.json"
        self._stale = False
        self.manifest = self._read_manifest()
        if self._stale:
            self.reset()

    def _read_manifest(self) -> dict[str, Any]:
        empty = {"version": CACHE_VERSION, "files": {}, "segments": [], "bad": {}, "lines": 0}
        try:
            manifest = _loads(self.manifest_path.read_bytes())
        except (OSError, ValueError):
            return empty
        if not isinstance(manifest, dict) or manifest.get("version") != CACHE_VERSION:
            self._stale = True  # written by another version: its segments go too
            return empty
        return manifest

    def tails(self, files: Sequence[str], base: Path) -> list[_Tail] | None:
        """What is new in *files*; None when a file shrank or was rewritten (rebuild)."""
        known = self.manifest["files"]
        out = []
        for name in files:
            key = _key(name, base)
            try:
                st = os.stat(name)
            except OSError:
                continue
            entry = known.get(key)
            if entry is None:
                out.append(_Tail(name, key, 0, st.st_size, st.st_mtime_ns))
                continue
            if st.st_size < entry["offset"] or (
                st.st_size == entry["size"] and st.st_mtime_ns != entry["mtime_ns"]
            ):
                return None
            if st.st_size > entry["offset"] and (
                st.st_size != entry["size"] or st.st_mtime_ns != entry["mtime_ns"]
            ):
                out.append(_Tail(name, key, entry["offset"], st.st_size, st.st_mtime_ns))
        return out

    def pending(self) -> int:
        return sum(1 for e in self.manifest["files"].values() if e.get("pending"))

    def reset(self) -> None:
        for seg in self.dir.glob("seg*") if self.dir.is_dir() else ():
            seg.unlink(missing_ok=True)
        self.manifest = {
            "version": CACHE_VERSION,
            "files": {},
            "segments": [],
            "bad": {},
            "lines": 0,
        }

    def add(
        self,
        frame: Frame,
        tails: Sequence[_Tail],
        offsets: dict[str, int],
        pending: dict[str, bool],
    ) -> None:
        """Store the newly parsed *frame* as a segment and record what was consumed."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if frame.records:
            span = frame.span()
            assert span is not None
            name = f"seg{len(self.manifest['segments']):05d}.cols"
            _save_segment(self.dir / name, frame)
            self.manifest["segments"].append(
                {"name": name, "ts_min": span[0], "ts_max": span[1], "records": frame.records}
            )
        for tail in tails:
            self.manifest["files"][tail.key] = {
                "offset": offsets.get(tail.key, tail.offset),
                "size": tail.size,
                "mtime_ns": tail.mtime_ns,
                "pending": pending.get(tail.key, False),
            }
        bad = Counter(self.manifest["bad"])
        bad.update(frame.bad)
        self.manifest["bad"] = dict(bad)
        self.manifest["lines"] += frame.lines
        _write_json(self.manifest_path, self.manifest)

    def load(self, since: float | None, until: float | None) -> Stored:
        """The segments that may hold records in [since, until], headers checked, and the counts."""
        segments = []
        for seg in self.manifest["segments"]:
            if since is not None and seg["ts_max"] < since:
                continue
            if until is not None and seg["ts_min"] > until:
                continue
            segments.append(Segment(self.dir / seg["name"]))
        bad = Counter(self.manifest["bad"])
        bad["truncated"] += self.pending()
        bad += Counter()  # drop zero counts
        return Stored(
            segments, bad, self.manifest["lines"] + self.pending(), len(self.manifest["files"])
        )


@dataclass
class Stored:
    """One hour's cached segments (not read yet) and its input counts."""

    segments: list[Segment]
    bad: Counter[str]
    lines: int
    files: int


def _join(parts: Sequence[Frame | Stored]) -> Frame:
    """One frame from every part: cached columns are read straight into the joined arrays."""
    bad: Counter[str] = Counter()
    files = lines = 0
    for part in parts:
        bad.update(part.bad)
        files += part.files
        lines += part.lines
    stored = [p for p in parts if isinstance(p, Stored)]
    frames = [p for p in parts if isinstance(p, Frame) and p.records]
    if frames and not any(s.segments for s in stored):
        frame = concat(frames)  # one frame (say, every column mirror at once): no copy
    elif len(stored) == len(parts):
        frame = assemble([seg for h in stored for seg in h.segments])
    else:
        frame = concat([_materialise(p) for p in parts])
    frame.bad, frame.files, frame.lines = bad, files, lines
    return frame


def _materialise(part: Frame | Stored) -> Frame:
    return part if isinstance(part, Frame) else assemble(part.segments)


def group_by_hour(files: Sequence[str]) -> dict[str, list[str]]:
    """Source files by their hourly bucket."""
    groups: dict[str, list[str]] = {}
    for path in files:
        groups.setdefault(hour_of(path), []).append(path)
    return groups


def read_frame(
    path: Path,
    *,
    files: Sequence[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    cache_root: Path | None = None,
    workers: int = 1,
    column_files: bool = True,
) -> Frame:
    """Read the records under *path* that may fall in [since, until] into one frame.

    Files with a column mirror (:mod:`guardctl.telemetry.mirror`) are read from it, and
    only the bytes it does not cover yet are parsed. The others are parsed;
    with *cache_root*, their parsed bytes are kept there and only new bytes are
    parsed next time. An unwritable cache is silently skipped (reading must
    never fail for it).
    """
    groups = group_by_hour(source_files(path) if files is None else files)
    base = path if path.is_dir() else path.parent
    if since is None and until is None:
        wanted = sorted(groups)
    else:
        wanted = hours_needed(list(groups), since, until)
    caches = {hour: _open_cache(cache_root, hour) for hour in wanted}
    parts: list[Frame | Stored] = []
    if column_files:
        # A file the cache has parsed stays with the cache for its hour: never counted twice.
        todo = [f for hour in wanted for f in groups[hour] if not _cached(caches[hour], f, base)]
        mirrored, unmirrored = _read_mirrored(todo, workers)
        parts += mirrored
        done = set(todo).difference(unmirrored)
        groups = {hour: [f for f in groups[hour] if f not in done] for hour in wanted}
    for hour in wanted:
        if groups[hour]:
            parts.append(_read_hour(groups[hour], base, caches[hour], since, until, workers))
    try:
        return _join(parts)
    except _CACHE_ERRORS:  # a segment went away since its header was read: parse afresh
        if cache_root is None:
            raise
        return read_frame(
            path, files=files, since=since, until=until, workers=workers, column_files=column_files
        )


def _key(name: str, base: Path) -> str:
    """A file's name in the cache manifest: relative to the input path."""
    prefix = os.fspath(base) + os.sep
    return name[len(prefix) :] if name.startswith(prefix) else name


def _cached(cache: HourCache | None, name: str, base: Path) -> bool:
    return cache is not None and _key(name, base) in cache.manifest["files"]


def _open_cache(cache_root: Path | None, hour: str) -> HourCache | None:
    if cache_root is None:
        return None
    try:
        return HourCache(cache_root, hour)
    except _CACHE_ERRORS:
        return None


def _read_mirrored(files: Sequence[str], workers: int) -> tuple[list[Frame | Stored], list[str]]:
    """Records of *files* from their column mirrors, plus the bytes past what those cover.

    Returns the frames and the files without a usable mirror (to be parsed).
    """
    paths, sizes, inodes = [], [], []
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            continue  # vanished since it was listed
        paths.append(name)
        sizes.append(st.st_size)
        inodes.append(st.st_ino)
    found = mirrors.read_many(paths, sizes, inodes)
    tails = [
        _Tail(p, p, covered, size, 0)
        for p, ok, covered, size in zip(paths, found.usable, found.covered, sizes, strict=True)
        if ok and covered < size
    ]
    rest, _, pending = parse_tails(tails, workers)  # written since the mirror's last batch
    rest.files = 0  # counted with the mirror
    _count_pending(rest, pending)
    unmirrored = [p for p, ok in zip(paths, found.usable, strict=True) if not ok]
    return [found.frame, rest], unmirrored


def _read_hour(
    files: Sequence[str],
    base: Path,
    cache: HourCache | None,
    since: float | None,
    until: float | None,
    workers: int,
) -> Frame | Stored:
    """Parse *files* of one hourly bucket, through its cache where there is one."""
    if cache is None:
        return _parse_whole(files, workers)
    for attempt in range(2):
        try:
            if attempt:
                cache.reset()  # a damaged or vanished segment: rebuild this hour once
            _refresh(cache, files, base, workers)
            return cache.load(since, until)
        except _CACHE_ERRORS:
            continue
    # no usable cache (read-only or full store): parse without it
    return _parse_whole(files, workers)


def _parse_whole(files: Sequence[str], workers: int) -> Frame:
    tails = [_Tail(f, str(f), 0, _size(f), 0) for f in files]
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


def _refresh(cache: HourCache, files: Sequence[str], base: Path, workers: int) -> None:
    """Parse what is new in *files* into *cache*."""
    tails = cache.tails(files, base)
    if tails is None:
        cache.reset()
        tails = cache.tails(files, base) or []
    if tails:
        frame, offsets, pending = parse_tails(tails, workers)
        cache.add(frame, tails, offsets, pending)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
