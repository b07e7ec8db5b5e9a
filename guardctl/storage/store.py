"""The shared store: its marker, checking files against schema v1, and retention.

:func:`init` marks a directory as the site's shared store and lays out its directories with the
modes they need (the administrator, once, with the shared filesystem mounted);
:func:`require_marked` is what every long-running writer (the node agent, the controller, a hook
that drains) checks before it writes, so that a store that is not mounted is refused rather than
silently replaced by a directory on local disk.
:func:`check` tells an operator what a file or directory of records holds
(good records per kind, bad lines per reason); :func:`prune` deletes the
telemetry and step files whose time segment ended before the retention, and sooner the
JSON Lines that a closed segment (:mod:`guardctl.storage.closed`) holds whole. Writing
lives in :mod:`guardctl.storage.writer`; the layout in :mod:`guardctl.storage.layout`.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guardctl.errors import InputError, StoreError, UsageError
from guardctl.fileio import atomic_write
from guardctl.sections.store import StoreSettings
from guardctl.storage import layout, segments
from guardctl.telemetry.schema import input_files, iter_file

if TYPE_CHECKING:
    from guardctl.storage.closed import Manifest

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``"7d"`` -> 604800.0; units s, m, h, d, w. Raises UsageError otherwise."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UsageError(
            f"invalid duration {text!r}: expected a positive number and a unit "
            "(s, m, h, d, w), e.g. 7d or 12h"
        )
    return float(match.group(1)) * _UNIT_S[match.group(2)]


# -- the marker ---------------------------------------------------------------

# A file at the store's root that only `guardctl store init` writes. Where the shared filesystem
# is not mounted, the mount point is an empty local directory: no marker, so nothing is written.
MARKER = ".guardctl-store"


# The store's top-level directories and their modes (docs/telemetry.md, "Ownership and modes of
# the store"). Ranks of users' jobs create their job's directory under steps/ and dds/: those are
# world-writable with the sticky bit, like /tmp, so any user can add a directory and none can
# remove or rename another's. Everything else is written by root-run daemons (the agents, the
# controller, the hooks) and only read by operators: root-owned and not writable by others.
SHARED_MODE = 0o1777
DAEMON_MODE = 0o755
TOP_DIRS: dict[str, int] = {
    "steps": SHARED_MODE,
    "dds": SHARED_MODE,
    "telemetry": DAEMON_MODE,
    "segments": DAEMON_MODE,
    "actions": DAEMON_MODE,
    "control": DAEMON_MODE,
    "clocks": DAEMON_MODE,
    "sweeps": DAEMON_MODE,
    "baselines": DAEMON_MODE,
    "cache": DAEMON_MODE,
}


def init(root: Path) -> Path:
    """Mark *root* as the site's shared store and lay out its directories; returns the marker.

    Creates *root* (0755) if needed and each directory of :data:`TOP_DIRS` with its mode, setting
    the mode of those that exist (the umask plays no part); run again, it repairs the modes.
    """
    marker = root / MARKER
    try:
        if not root.is_dir():
            root.mkdir(parents=True)
            os.chmod(root, DAEMON_MODE)
        for name, mode in TOP_DIRS.items():
            (root / name).mkdir(exist_ok=True)
            os.chmod(root / name, mode)
        if not marker.is_file():
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            atomic_write(
                marker, f"guardctl shared store, marked {when} on {socket.gethostname()}\n"
            )
    except OSError as exc:
        raise StoreError(f"cannot mark {root} as the store: {exc.strerror or exc}") from None
    return marker


def unmarked(root: Path) -> str:
    """Why *root* is not the store `guardctl store init` marked ("" when it is)."""
    try:
        os.stat(root / MARKER)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            where = (
                "store.root is not set and the default is a local directory"
                if root == StoreSettings().root
                else "the shared filesystem is not mounted there, or store.root is wrong"
            )
            return (
                f"store {root} is not guardctl's shared store: {MARKER} is missing ({where});"
                " set [store] root or GUARDCTL_STORE to the mounted store, or mark it once "
                f"with 'guardctl store init {root}'; nothing was written"
            )
        return f"store {root}: cannot read {MARKER}: {exc.strerror or exc}; nothing was written"
    return ""


def require_marked(root: Path) -> None:
    """Raise :class:`StoreError` (exit 8) unless *root* carries the store's marker."""
    why = unmarked(root)
    if why:
        raise StoreError(why)


# -- check --------------------------------------------------------------------


@dataclass
class CheckReport:
    """What a file or directory of schema-v1 records holds."""

    path: str
    files: int = 0
    lines: int = 0
    good: Counter[str] = field(default_factory=Counter)  # kind -> records
    bad: Counter[str] = field(default_factory=Counter)  # reason -> lines
    bad_files: dict[str, dict[str, int]] = field(default_factory=dict)
    # column mirrors (guardctl.telemetry.mirror): files per state, and those whose mirror differs
    mirrors: Counter[str] = field(default_factory=Counter)
    mirror_differs: list[str] = field(default_factory=list)

    @property
    def bad_total(self) -> int:
        return sum(self.bad.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "files": self.files,
            "lines": self.lines,
            "good": dict(sorted(self.good.items())),
            "good_total": sum(self.good.values()),
            "bad": dict(sorted(self.bad.items())),
            "bad_total": self.bad_total,
            "bad_files": self.bad_files,
            "mirrors": dict(sorted(self.mirrors.items())),
            "mirror_differs": self.mirror_differs,
        }


def check(path: Path) -> CheckReport:
    """Read every line under *path*, and check each file's column mirror against it.

    InputError if *path* itself cannot be read.
    """
    try:
        files = input_files(path)
    except OSError as exc:
        raise InputError(
            f"{path}: cannot read: {exc.strerror or 'no such file or directory'}"
        ) from None
    report = CheckReport(str(path))
    manifests: _Manifests = {}
    for file in files:
        bad: Counter[str] = Counter()
        try:
            for record in iter_file(file, bad):
                report.good[record["kind"]] += 1
        except OSError as exc:
            if file == path:
                raise InputError(f"{path}: cannot read: {exc.strerror}") from None
            bad["unreadable_file"] += 1
        report.files += 1
        report.bad.update(bad)
        if bad:
            report.bad_files[str(file)] = dict(bad)
        _check_mirror(file, report, manifests)
    report.lines = sum(report.good.values()) + report.bad_total
    return report


# Closed segments' manifests by store and segment (None: not closed), read once each.
_Manifests = dict[tuple[Path, str], "Manifest | None"]


def _check_mirror(file: Path, report: CheckReport, manifests: _Manifests) -> None:
    from guardctl.analyze import mirrors  # numpy and the parser: only here

    try:
        state = mirrors.verify(file)
    except OSError:
        return  # the file itself was unreadable: counted above
    if state == "none" and _closed_whole(file, manifests):
        state = "closed"  # removed by prune from a closed segment, which readers read instead
    report.mirrors[state] += 1
    if state == "differs":
        report.mirror_differs.append(str(file))


def _closed_whole(file: Path, manifests: _Manifests) -> bool:
    """Whether *file* lies in a store (``telemetry/<segment>/``, ``telemetry/<node>/`` or
    ``steps/<job>/``) whose closed segment was made from all of it (*manifests*: those read
    so far, by store and segment)."""
    root = file.parent.parent.parent
    if file.parent.parent not in layout.telemetry_inputs(root):
        return False
    key = (root, segments.segment_of(file))
    if key not in manifests:
        manifests[key] = None
        if layout.manifests_dir(root).is_dir():  # pyarrow loads only where one was closed
            from guardctl.storage import closed

            manifests[key] = closed.read_manifest(root, key[1])
    manifest = manifests[key]
    return manifest is not None and manifest.holds_whole(os.fspath(file.relative_to(root)))


# -- prune --------------------------------------------------------------------


@dataclass
class PruneReport:
    """What pruning removed (or would, under --dry-run): every file older than the retention
    (*files*), and, newer than that, the JSON Lines of closed segments past the raw retention
    (*raw_files*), with why the others past it were kept (*raw_kept*: reason -> files)."""

    root: str
    cutoff: float
    dry_run: bool
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    raw_cutoff: float | None = None
    raw_files: list[str] = field(default_factory=list)
    raw_bytes: int = 0
    raw_kept: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "cutoff": self.cutoff,
            "dry_run": self.dry_run,
            "files": self.files,
            "count": len(self.files),
            "bytes": self.bytes,
            "raw_cutoff": self.raw_cutoff,
            "raw_files": self.raw_files,
            "raw_count": len(self.raw_files),
            "raw_bytes": self.raw_bytes,
            "raw_kept": dict(sorted(self.raw_kept.items())),
            "errors": self.errors,
        }


def _segment_files(root: Path) -> list[Path]:
    """Every telemetry and step file named by the layout (JSON Lines and column mirrors), a
    mirror before its JSON Lines file: an interrupted prune never leaves a file without it."""
    found = []
    for top in layout.telemetry_inputs(root):
        if top.is_dir():
            found += [p for p in top.rglob("*") if p.suffix in (".jsonl", ".cols")]
    # Files not named by the layout are not ours to delete.
    return sorted(p for p in found if segments.file_span(p) is not None)


def _ended_by(files: list[Path], cutoff: float) -> list[Path]:
    out = []
    for path in files:
        bounds = segments.file_span(path)
        if bounds is not None and bounds[1] <= cutoff and path.is_file():
            out.append(path)
    return out


def expired_segments(root: Path, cutoff: float) -> list[Path]:
    """Closed segments (their manifest first, then their Parquet files) that ended by *cutoff*:
    without its manifest a segment is no longer read, so an interrupted prune leaves none half
    read."""
    manifests: list[Path] = []
    parquet: list[Path] = []
    top = layout.segments_dir(root)
    for path in sorted(top.rglob("*")) if top.is_dir() else []:
        if path.suffix not in (".json", ".parquet") or not path.is_file():
            continue
        bounds = segments.span(path.stem)
        if bounds is not None and bounds[1] <= cutoff:
            (manifests if path.suffix == ".json" else parquet).append(path)
    return manifests + parquet


# Why JSON Lines past the raw retention stay (until the retention itself).
NOT_CLOSED = "segment not closed"
NO_MANIFEST = "manifest unreadable"
CHANGED = "segment changed since closed"
UNFINISHED = "last line unfinished"


def raw_expired_files(
    root: Path,
    files: list[Path],
    cutoff: float,
    raw_cutoff: float,
    kept: Counter[str],
    mirror_cutoff: float | None = None,
) -> list[Path]:
    """Of *files* (:func:`_segment_files`), those closed segments made redundant: of segments
    that ended after *cutoff*, are closed, and whose closed segment holds every one of their
    files to its last byte, the JSON Lines (each after its column mirror) of those that ended
    by *raw_cutoff* (the Parquet is then the only copy any reader needs), and the column
    mirrors of those that ended by *mirror_cutoff* (never later than *raw_cutoff*): every
    reader reads a closed segment from its Parquet files, and only closing it again, while it
    may still grow, reads its mirrors. JSON Lines kept past *raw_cutoff* are counted in *kept*
    by reason."""
    if mirror_cutoff is None or mirror_cutoff < raw_cutoff:
        mirror_cutoff = raw_cutoff
    by_segment: dict[str, list[Path]] = {}
    for path in files:
        bounds = segments.file_span(path)
        if path.suffix == ".jsonl" and bounds is not None and cutoff < bounds[1] <= mirror_cutoff:
            by_segment.setdefault(segments.segment_of(path), []).append(path)
    if not by_segment:
        return []
    listed = set(files)
    closed_names = layout.closed_segments(root)  # one listing of the manifests, not one look each
    out = []
    for name, paths in sorted(by_segment.items()):
        raw = segments.span(name)[1] <= raw_cutoff  # type: ignore[index]
        for path in _held_whole(root, name, paths, closed_names, kept if raw else Counter()):
            mirror = path.with_suffix(".cols")
            out += [mirror] if mirror in listed else []
            out += [path] if raw else []
    return out


def _held_whole(
    root: Path, name: str, paths: list[Path], closed_names: frozenset[str], kept: Counter[str]
) -> list[Path]:
    """The files of segment *name* its closed segment holds whole: none unless every file of
    the segment is as it was when the segment was closed. A file that grew, or a file it was
    not made from, means the segment is written again (`guardctl store compact`), and that
    rewrite reads every file of it: none may go before it."""
    from guardctl.storage import closed

    manifest = closed.read_manifest(root, name) if name in closed_names else None
    if manifest is None:
        kept[NOT_CLOSED if name not in closed_names else NO_MANIFEST] += len(paths)
        return []
    whole = []
    for path in paths:
        relative = closed.relative(root, os.fspath(path))
        recorded = manifest.files.get(relative)
        try:
            st = path.stat()
        except OSError:  # gone since the listing (another prune): judged at the next one
            kept[CHANGED] += len(paths)
            return []
        if recorded is None or st.st_size != recorded[1] or not manifest.same_file(relative, st):
            kept[CHANGED] += len(paths)
            return []
        if manifest.holds_whole(relative):
            whole.append(path)
    if len(whole) < len(paths):  # a last line cut short stays (read as cut short) until retention
        kept[UNFINISHED] += len(paths) - len(whole)
    return whole


def prune(
    root: Path,
    older_than_s: float,
    *,
    raw_older_than_s: float | None = None,
    now: float | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete segment files older than *older_than_s*, and node/job directories left empty.
    With *raw_older_than_s*, also the JSON Lines of closed segments older than that, where
    the closed segment holds them whole, and their column mirrors once they may no longer
    grow (:func:`raw_expired_files`); longer than *older_than_s* means *older_than_s*."""
    now = time.time() if now is None else now
    cutoff = now - older_than_s
    raw_cutoff = None if raw_older_than_s is None else max(now - raw_older_than_s, cutoff)
    report = PruneReport(str(root), cutoff, dry_run, raw_cutoff=raw_cutoff)
    if not root.is_dir():
        raise StoreError(f"{root}: store directory not found")
    files = _segment_files(root)
    report.bytes = _delete(_ended_by(files, cutoff), root, report, report.files)
    report.bytes += _delete(expired_segments(root, cutoff), root, report, report.files)
    if raw_cutoff is not None:
        # Mirrors go once a segment may no longer grow (segments.LATE_S): the leader closes
        # it again until then, from them.
        late = now - segments.LATE_S
        raw = raw_expired_files(root, files, cutoff, raw_cutoff, report.raw_kept, late)
        report.raw_bytes = _delete(raw, root, report, report.raw_files)
    if report.errors:
        raise StoreError(f"could not delete {len(report.errors)} files, first: {report.errors[0]}")
    return report


def _delete(paths: list[Path], root: Path, report: PruneReport, done: list[str]) -> int:
    """Delete *paths* in order (none under a dry run), each listed in *done*; their bytes."""
    total = 0
    emptied: set[Path] = set()
    for path in paths:
        try:
            size = path.stat().st_size
            if not report.dry_run:
                path.unlink()
                emptied.add(path.parent)
        except FileNotFoundError:
            continue  # gone since the listing (another prune): nothing to report
        except OSError as exc:
            report.errors.append(f"{path}: {exc.strerror}")
            continue
        done.append(str(path))
        total += size
    # Once per directory, not per file: an hourly prune deletes a dozen files a node.
    for directory in sorted(emptied, reverse=True):
        _remove_if_empty(directory, root)
    return total


def _remove_if_empty(directory: Path, root: Path) -> None:
    # A node's or a job's directory goes with its last file, a closed segment's partitions
    # with theirs; the top-level ones stay.
    keep = {*layout.telemetry_inputs(root), layout.segments_dir(root), layout.manifests_dir(root)}
    while directory not in keep and directory != root and root in directory.parents:
        try:
            directory.rmdir()
        except OSError:  # not empty, or already gone: fine
            return
        directory = directory.parent
