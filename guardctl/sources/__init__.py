"""Telemetry sources other than the store: what the cluster's Prometheus already collects.

A source turns a time range into the same :class:`~guardctl.analyze.frame.Frame` the
store gives, so every judgement stays the analyzer's. :func:`open_source` picks one
from ``--from KIND LOCATION`` or the ``[source]`` settings: the store
(:class:`~guardctl.storage.source.StoreSource`), Prometheus alone
(:class:`PrometheusSource`, ``source.store_kinds`` empty) or, by default, Prometheus
mixed with the store (:class:`MixedSource`): that one also reads the record kinds of
``source.store_kinds`` (the probe's step records) from the ``--input`` path (a store,
a directory of ``*.jsonl`` or one file, read as ``analyze --input`` reads it) or else
the configured store where it exists, so that one analysis has both; when that finds
no record of those kinds, the coverage says so (:meth:`Coverage.store_warning`), as
``analyze`` does in one line on stderr. With ``source.jobs_from = "slurm"`` the GPUs'
jobs come from Slurm's job list where the exporter labels none
(:mod:`guardctl.sources.slurm_jobs`), through *slurm* (default: the configured client).

Entry points: :func:`open_source`, then the :class:`~guardctl.storage.source.Source` it
gives: :meth:`~PrometheusSource.analyze` for one pass, as ``analyze`` runs it (or
:func:`analyze_source`), :meth:`~PrometheusSource.load` / :meth:`~PrometheusSource.recent`
for reports.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from guardctl.analyze import Analysis, analyze_frame, history_needed, load
from guardctl.analyze.engine import until_now
from guardctl.analyze.frame import Frame, concat
from guardctl.config import Settings
from guardctl.errors import SourceError, UsageError
from guardctl.slurm.types import SlurmClient
from guardctl.sources.prometheus import Coverage, PrometheusClient, fetch
from guardctl.sources.slurm_jobs import NodeJobs, read_node_jobs
from guardctl.storage.source import Source, StoreSource

if TYPE_CHECKING:
    from guardctl.analyze.incremental import Analyzer

KINDS = ("store", "prometheus")  # what --from names

__all__ = [
    "KINDS",
    "Coverage",
    "MixedSource",
    "PrometheusSource",
    "Source",
    "StoreSource",
    "analyze_source",
    "open_source",
]


class PrometheusSource:
    """The cluster's Prometheus alone: the exporters' series (``source.store_kinds`` empty)."""

    kind = "prometheus"

    def __init__(self, settings: Settings, url: str, slurm: SlurmClient | None = None) -> None:
        self.settings = settings
        self.url = url
        self.slurm = slurm  # for jobs_from = "slurm" (None: the configured one)
        self.coverage: Coverage | None = None  # what Prometheus gave on the last load

    def describe(self) -> str:
        return self.url

    def span(self, window_s: float | None = None) -> float:
        # One span for every kind: the judged windows (Prometheus keeps no ranks' history).
        return history_needed(self.settings.analyze, window_s)

    def load(self, since: float | None, until: float | None) -> Frame:
        frame, coverage = self._fetch(since, until)
        self.coverage = coverage
        return frame

    def recent(self, span: float) -> Frame:
        """The *span* seconds before now."""
        now = time.time()
        return self.load(now - span, now)

    def frame(self, at: float | None = None, *, window_s: float | None = None) -> Frame:
        """What one pass at *at* (default: now) reads; no exporter series in it: SourceError."""
        span = self.span(window_s)
        frame = self.load(at - span, at) if at is not None else self.recent(span)
        if self.coverage is not None and not self.coverage.samples:
            raise SourceError(
                f"{self.url}: no dcgm-exporter or node_exporter series in the "
                f"{span:g} s before {'now' if at is None else at}"
            )
        return frame

    def analyze(self, at: float | None = None, *, window_s: float | None = None) -> Analysis:
        frame = self.frame(at, window_s=window_s)
        # The store's records mixed in may come from a clock ahead, as the store's own pass reads.
        until = until_now(self.settings) if at is None else None
        return analyze_frame(frame, self.settings.analyze, at=at, window_s=window_s, until=until)

    def newest(self, analyzer: Analyzer) -> Analysis:
        # Prometheus has no cursor to tail: each pass asks for the whole span again.
        return self.analyze()

    def _fetch(self, since: float | None, until: float | None) -> tuple[Frame, Coverage]:
        if since is None or until is None:
            raise UsageError("a Prometheus source needs a time range")
        client = PrometheusClient(self.url, self.settings.source)
        jobs = self._slurm_jobs()
        return fetch(client, self.settings.source, since, until, jobs)

    def _slurm_jobs(self) -> NodeJobs | None:
        """Slurm's jobs where ``jobs_from = "slurm"``, read before Prometheus (fails first)."""
        if self.settings.source.jobs_from != "slurm":
            return None
        if self.slurm is None:
            from guardctl.slurm import make_client

            self.slurm = make_client(self.settings)
        return read_node_jobs(self.slurm)


class MixedSource(PrometheusSource):
    """Prometheus with the store's records of ``source.store_kinds`` (the probe's step records,
    which no exporter has), read from *store* (the ``--input`` path; None: the configured store
    where it exists)."""

    kind = "mixed"

    def __init__(
        self,
        settings: Settings,
        url: str,
        store: Path | None = None,
        slurm: SlurmClient | None = None,
    ) -> None:
        super().__init__(settings, url, slurm)
        self.store = store

    def load(self, since: float | None, until: float | None) -> Frame:
        frame, coverage = self._fetch(since, until)
        mixed = self._store_part(since, until, coverage)
        self.coverage = coverage
        return concat([frame, mixed]) if mixed is not None else frame

    def _store_part(
        self, since: float | None, until: float | None, coverage: Coverage
    ) -> Frame | None:
        """The records of ``store_kinds`` from ``--input`` (whatever ``analyze --input``
        reads: a store, a directory of files, a file; missing: the error it gives there) or
        the configured store where one exists; counted in *coverage*."""
        kinds = self.settings.source.store_kinds
        root = self.store if self.store is not None else self.settings.store.root
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
            return _prometheus(settings, settings.source.url, input_path, slurm)
        return StoreSource(settings, input_path)
    kind, location = from_opt
    if kind not in KINDS:
        raise UsageError(f"--from: expected one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "store":
        if input_path is not None:
            raise UsageError("--from store PATH and --input PATH: give one of them")
        return StoreSource(settings, Path(location))
    return _prometheus(settings, location, input_path, slurm)


def _prometheus(
    settings: Settings, url: str, store: Path | None, slurm: SlurmClient | None
) -> PrometheusSource:
    """Prometheus, with the store's records where ``source.store_kinds`` names some (then
    *store*, the ``--input`` path, is where they are read; without any, it is not read)."""
    if settings.source.store_kinds:
        return MixedSource(settings, url, store, slurm)
    return PrometheusSource(settings, url, slurm)


def analyze_source(
    source: Source, at: float | None = None, *, window_s: float | None = None
) -> Analysis:
    """One analysis pass over *source*, as :func:`guardctl.analyze.analyze` is over the store."""
    return source.analyze(at, window_s=window_s)
