"""Closing ended segments: their JSON Lines, of every node, read once and written as Parquet.

Run by the controller's leader after each pass and by ``guardctl store compact`` (a cron
job where no controller runs). A segment is closed once it ended ``grace_s`` ago (the
agents' last batch of it written, clocks a little apart); a closed segment whose files
have grown since (an agent writing its backlog after an outage) or gained a file is
written again. Two compactions at once write the same files, each by rename: no lock.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl.analyze.load import is_store, read_consumed, source_files
from guardctl.errors import InputError, StoreError
from guardctl.storage import closed, layout, segments

# Files read and written at a time: bounds the memory of closing a segment of a large fleet
# (an hour of 1,000 nodes is about 2 GiB of JSON Lines).
FILES_AT_ONCE = 500


@dataclass
class CompactReport:
    """What one compaction did."""

    closed: list[str] = field(default_factory=list)  # segments written (new or grown)
    current: int = 0  # segments already closed and unchanged
    looked: int = 0  # of those, the segments whose files were looked at (a stat of each)
    open: int = 0  # segments not ended yet (or within the grace)
    deferred: int = 0  # ended, left for the next compaction (out of time)
    records: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "closed": self.closed,
            "current": self.current,
            "looked": self.looked,
            "open": self.open,
            "deferred": self.deferred,
            "records": self.records,
        }


def compact(
    root: Path,
    now: float,
    *,
    grace_s: float = segments.GRACE_S,
    workers: int = 1,
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
    budget_s: float | None = None,
    rechecks: segments.Rechecks | None = None,
    dry_run: bool = False,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> CompactReport:
    """Close every segment of the store at *root* that ended *grace_s* before *now*. With
    *budget_s*, no segment is begun after that many seconds: the rest wait for the next call
    (a segment is written whole or not at all). With *rechecks* (kept from call to call), a
    closed segment's files are looked at again only when it is due (:class:`segments.Rechecks`):
    bytes they gain meanwhile are still read past it; a call without it looks at every
    closed segment. A dry run lists what it would close. *groups*: the store's files by
    segment (:func:`segments.group_files`) as a caller that lists the store anyway found them
    (the controller's analyzer, each pass): the store is not walked again; without it, it is."""
    if not is_store(root):  # a store not mounted, or a path that is none: nothing to close
        raise InputError(f"{root}: not a store (no telemetry/ or steps/ directory)")
    report = CompactReport()
    started = time.monotonic()
    if groups is None:
        groups = segments.group_files(source_files(root))
    closed_names = layout.closed_segments(root) if rechecks is not None else frozenset()
    for name in sorted(groups):
        bounds = segments.span(name)
        if bounds is None:
            continue  # files named by hand: never closed
        if bounds[1] + grace_s > now:
            report.open += 1
            continue
        if (
            rechecks is not None
            and name in closed_names
            and _not_due(root, name, bounds[1], now, rechecks)
        ):
            report.current += 1  # closed, and not due to be looked at again
            continue
        if is_current(root, name, groups[name]):
            report.current += 1
            report.looked += 1
            if rechecks is not None:
                rechecks.saw(name, bounds[1], now)
                if not dry_run:
                    closed.mark_looked(root, name, now)
            continue
        if budget_s is not None and time.monotonic() - started >= budget_s:
            report.deferred += 1
            continue
        if dry_run:
            report.closed.append(name)
            continue
        if progress is not None:
            progress(name)
        report.records += close(root, name, bounds, groups[name], workers, threads)
        report.closed.append(name)
        if rechecks is not None:
            rechecks.saw(name, bounds[1], now)
            closed.mark_looked(root, name, now)  # in the leader's clock, as its looks
    if rechecks is not None:
        rechecks.forget_settled(now)
    return report


def _not_due(root: Path, name: str, end: float, now: float, rechecks: segments.Rechecks) -> bool:
    """Whether closed segment *name* need not be looked at now. One this leader never looked
    at counts as looked at when a leader last did (its manifest's time, :func:`closed.mark_looked`:
    a stat, once, of each recent manifest), so that a new leader's first pass does not stat
    every node's file of the last hours again."""
    if name not in rechecks.last_look and now < end + rechecks.window_s:
        rechecks.adopt(name, end, closed.looked_at(root, name), now)
    return not rechecks.due(name, end, now)


def is_current(root: Path, name: str, files: Sequence[str]) -> bool:
    """Whether segment *name* is closed and stays as it is: made from *files* as they are
    now, or the only copy left of files retention removed (:func:`closed.outlived`)."""
    manifest = closed.read_manifest(root, name)
    return manifest is not None and (
        closed.is_current(root, manifest, files) or closed.outlived(root, manifest, files)
    )


def close(
    root: Path,
    name: str,
    bounds: tuple[float, float],
    files: Sequence[str],
    workers: int,
    threads: int = 1,
) -> int:
    """Write segment *name* from *files*, :data:`FILES_AT_ONCE` at a time; the records written."""
    writer = closed.SegmentWriter(root, name, bounds[0])
    manifest = closed.Manifest(name, bounds[0], bounds[1], files={}, kinds={})
    try:
        for lo in range(0, len(files), FILES_AT_ONCE):
            frame, consumed, inodes = read_consumed(
                files[lo : lo + FILES_AT_ONCE], workers, threads
            )
            writer.add(frame)
            manifest.files.update({closed.relative(root, f): n for f, n in consumed.items()})
            manifest.inodes.update({closed.relative(root, f): i for f, i in inodes.items()})
            manifest.bad.update(frame.bad)
            manifest.lines += frame.lines
        writer.finish(manifest)
    except OSError as exc:  # full, read-only, not a directory: the files stay the records
        writer.abort()
        why = exc.strerror or str(exc)
        raise StoreError(f"{root}: cannot write closed segment {name}: {why}") from None
    except BaseException:
        writer.abort()
        raise
    return sum(manifest.kinds.values())


@dataclass
class MigrateReport:
    """What bringing a store written by an earlier guardctl up to date did."""

    compacted: CompactReport
    removed: list[str] = field(default_factory=list)  # store-relative paths
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.compacted.to_dict(), "removed": self.removed, "removed_bytes": self.bytes}


def migrate(
    root: Path,
    now: float,
    *,
    dry_run: bool = False,
    workers: int = 1,
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
) -> MigrateReport:
    """Bring a store that earlier versions wrote up to this one: close every segment that has
    ended, then remove the analyzer's old cache of parsed telemetry (``cache/analyze``),
    which nothing reads any more. The JSON Lines stay: the record of truth until retention.
    A dry run closes nothing and removes nothing, and says what it would."""
    report = compact(
        root, now, workers=workers, threads=threads, progress=progress, dry_run=dry_run
    )
    out = MigrateReport(report)
    old = layout.cache_dir(root) / "analyze"
    for path in sorted(old.rglob("*")) if old.is_dir() else []:
        if path.is_file():
            out.removed.append(os.fspath(path.relative_to(root)))
            out.bytes += path.stat().st_size
    if not dry_run and old.is_dir():
        shutil.rmtree(old)
    return out
