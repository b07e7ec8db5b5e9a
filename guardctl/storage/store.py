"""The shared store: its marker, checking files against schema v1, and retention.

:func:`init` marks a directory as the site's shared store and lays out its directories with the
modes they need (the administrator, once, with the shared filesystem mounted);
:func:`require_marked` is what every long-running writer (the node agent, the controller, a hook
that drains) checks before it writes, so that a store that is not mounted is refused rather than
silently replaced by a directory on local disk.
:func:`check` tells an operator what a file or directory of records holds
(good records per kind, bad lines per reason); :func:`prune` deletes the
telemetry and step files whose time segment ended before the retention. Writing
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
from typing import Any

from guardctl.errors import InputError, StoreError, UsageError
from guardctl.fileio import atomic_write
from guardctl.sections.store import StoreSettings
from guardctl.storage import layout, segments
from guardctl.telemetry.schema import input_files, iter_file

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
        _check_mirror(file, report)
    report.lines = sum(report.good.values()) + report.bad_total
    return report


def _check_mirror(file: Path, report: CheckReport) -> None:
    from guardctl.analyze import mirrors  # numpy and the parser: only here

    try:
        state = mirrors.verify(file)
    except OSError:
        return  # the file itself was unreadable: counted above
    report.mirrors[state] += 1
    if state == "differs":
        report.mirror_differs.append(str(file))


# -- prune --------------------------------------------------------------------


@dataclass
class PruneReport:
    """The hourly files older than the cutoff: removed, or would be under --dry-run."""

    root: str
    cutoff: float
    dry_run: bool
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "cutoff": self.cutoff,
            "dry_run": self.dry_run,
            "files": self.files,
            "count": len(self.files),
            "bytes": self.bytes,
            "errors": self.errors,
        }


def expired_files(root: Path, cutoff: float) -> list[Path]:
    """Telemetry and step files (and their column mirrors) whose segment ended by *cutoff*."""
    found = []
    for top in layout.telemetry_inputs(root):
        if not top.is_dir():
            continue
        # A mirror sorts before its JSON Lines file: never left without it by an interrupted prune.
        for path in sorted(p for p in top.rglob("*") if p.suffix in (".jsonl", ".cols")):
            bounds = segments.file_span(path.name)
            # Files not named by the layout are not ours to delete.
            if bounds is not None and bounds[1] <= cutoff and path.is_file():
                found.append(path)
    return found + expired_segments(root, cutoff)


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


def prune(
    root: Path, older_than_s: float, *, now: float | None = None, dry_run: bool = False
) -> PruneReport:
    """Delete segment files older than *older_than_s*, and node/job directories left empty."""
    cutoff = (time.time() if now is None else now) - older_than_s
    report = PruneReport(str(root), cutoff, dry_run)
    if not root.is_dir():
        raise StoreError(f"{root}: store directory not found")
    for path in expired_files(root, cutoff):
        size = path.stat().st_size
        if not dry_run:
            try:
                path.unlink()
            except OSError as exc:
                report.errors.append(f"{path}: {exc.strerror}")
                continue
            _remove_if_empty(path.parent, root)
        report.files.append(str(path))
        report.bytes += size
    if report.errors:
        raise StoreError(f"could not delete {len(report.errors)} files, first: {report.errors[0]}")
    return report


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
