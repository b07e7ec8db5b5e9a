"""Telemetry sources other than the store: what the cluster's Prometheus already collects.

A source turns a time range into the same :class:`~guardctl.analyze.frame.Frame` the
store gives, so every judgement stays the analyzer's. :func:`open_source` picks one
from ``--from KIND LOCATION`` or the ``[source]`` settings; a Prometheus source also
reads the record kinds of ``source.store_kinds`` (the probe's step records) from the
``--input`` path (a store, a directory of ``*.jsonl`` or one file, read as
``analyze --input`` reads it) or else the configured store where it exists, so that
one analysis has both; when that finds no record of those kinds, the coverage says so
(:meth:`Coverage.store_warning`), as ``analyze`` does in one line on stderr. With
``source.jobs_from = "slurm"`` the GPUs' jobs come from Slurm's job list where the
exporter labels none (:mod:`guardctl.sources.slurm_jobs`), through *slurm* (default:
the configured client).

Entry points: :func:`open_source`, then :meth:`Source.load` / :meth:`Source.recent`
(reports, the controller) or :func:`analyze_source` (one pass, as ``analyze`` runs it).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from guardctl.analyze import Analysis, analyze, analyze_frame, history_needed, load
from guardctl.analyze.engine import until_now
from guardctl.analyze.frame import Frame, concat
from guardctl.config import Settings
from guardctl.errors import SourceError, UsageError
from guardctl.slurm.types import SlurmClient
from guardctl.sources.prometheus import Coverage, PrometheusClient, fetch
from guardctl.sources.slurm_jobs import NodeJobs, read_node_jobs

KINDS = ("store", "prometheus")

__all__ = [
    "KINDS",
    "Coverage",
    "Source",
    "analyze_source",
    "open_source",
    "prometheus_frame",
]


@dataclass
class Source:
    """Where one command reads telemetry from: the store (*url* empty) or Prometheus."""

    settings: Settings
    store: Path | None  # the store or input path (None: the configured store)
    url: str = ""
    coverage: Coverage | None = None  # what Prometheus gave on the last load
    slurm: SlurmClient | None = None  # for jobs_from = "slurm" (None: the configured one)

    @property
    def kind(self) -> str:
        return "prometheus" if self.url else "store"

    def describe(self) -> str:
        return self.url or str(self.store if self.store is not None else self.settings.store.root)

    def load(self, since: float | None, until: float | None) -> Frame:
        """Telemetry with timestamps in [since, until]."""
        if not self.url:
            return load(self.store, self.settings, since=since, until=until)
        if since is None or until is None:
            raise UsageError("a Prometheus source needs a time range")
        client = PrometheusClient(self.url, self.settings.source)
        jobs = self._slurm_jobs()
        frame, coverage = fetch(client, self.settings.source, since, until, jobs)
        mixed = self._store_part(since, until, coverage)
        self.coverage = coverage
        return concat([frame, mixed]) if mixed is not None else frame

    def recent(self, span: float) -> Frame:
        """The last *span* seconds before now."""
        now = time.time()
        return self.load(now - span, now)

    def _slurm_jobs(self) -> NodeJobs | None:
        """Slurm's jobs where ``jobs_from = "slurm"``, read before Prometheus (fails first)."""
        if self.settings.source.jobs_from != "slurm":
            return None
        if self.slurm is None:
            from guardctl.slurm import make_client

            self.slurm = make_client(self.settings)
        return read_node_jobs(self.slurm)

    def _store_part(self, since: float, until: float, coverage: Coverage) -> Frame | None:
        """The records of ``store_kinds`` from ``--input`` (whatever ``analyze --input``
        reads: a store, a directory of files, a file; missing: the error it gives there) or
        the configured store where one exists; counted in *coverage*."""
        kinds = self.settings.source.store_kinds
        root = self.store if self.store is not None else self.settings.store.root
        if not kinds:
            return None
        coverage.store = {"path": str(root), "kinds": list(kinds), "files": 0, "records": 0}
        if self.store is None and not os.path.exists(root):
            return None
        frame = load(root, self.settings, since=since, until=until)
        for kind, cols in frame.cols.items():
            if kind not in kinds:  # Prometheus gives these: no record twice
                frame.cols[kind] = {name: col[:0] for name, col in cols.items()}
        found = sum(len(frame.cols[k]["ts"]) for k in kinds if k in frame.cols)
        coverage.store.update(files=frame.files, records=found)
        return frame


def open_source(
    settings: Settings,
    from_opt: tuple[str, str] | None,
    input_path: Path | None,
    slurm: SlurmClient | None = None,
) -> Source:
    """The source ``--from KIND LOCATION`` names, else the one ``[source]`` configures.

    ``--from store PATH`` is ``--input PATH``; with ``--from prometheus URL``,
    ``--input`` names the store whose step records join the analysis. *slurm* gives the
    GPUs' jobs where ``source.jobs_from = "slurm"`` (default: the configured client).
    """
    if from_opt is None:
        if settings.source.kind == "prometheus":
            return Source(settings, input_path, settings.source.url, slurm=slurm)
        return Source(settings, input_path)
    kind, location = from_opt
    if kind not in KINDS:
        raise UsageError(f"--from: expected one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "store":
        if input_path is not None:
            raise UsageError("--from store PATH and --input PATH: give one of them")
        return Source(settings, Path(location))
    return Source(settings, input_path, location, slurm=slurm)


def analyze_source(
    source: Source, at: float | None = None, *, window_s: float | None = None
) -> Analysis:
    """One analysis pass over *source*, as :func:`guardctl.analyze.analyze` is over the store."""
    settings = source.settings
    if not source.url:
        return analyze(source.store, settings, at, window_s=window_s)
    frame = prometheus_frame(source, at, window_s=window_s)
    # The store's records mixed in may come from a clock ahead, as the store's own pass reads.
    until = until_now(settings) if at is None else None
    return analyze_frame(frame, settings.analyze, at=at, window_s=window_s, until=until)


def prometheus_frame(
    source: Source, at: float | None = None, *, window_s: float | None = None
) -> Frame:
    """What one analysis pass at *at* (default: now) reads from a Prometheus *source*."""
    span = history_needed(source.settings.analyze, window_s)
    frame = source.load(at - span, at) if at is not None else source.recent(span)
    if source.coverage is not None and not source.coverage.samples:
        raise SourceError(
            f"{source.url}: no dcgm-exporter or node_exporter series in the "
            f"{span:g} s before {'now' if at is None else at}"
        )
    return frame
