"""Where a command reads telemetry from: what every telemetry source offers, and the store's.

:class:`Source` is what the analyzer's callers (``analyze``, reports, export, the controller)
need of a source, whichever it is: the store (:class:`StoreSource`, here), Prometheus alone
or Prometheus with the store's step records (:mod:`guardctl.sources`). Each gives the same
:class:`~guardctl.analyze.frame.Frame`, so every judgement stays the analyzer's; a caller
names the source by :attr:`Source.kind` and never asks which class it holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from guardctl.analyze import engine
from guardctl.analyze.engine import Analysis
from guardctl.analyze.frame import Frame
from guardctl.config import Settings

if TYPE_CHECKING:
    from guardctl.analyze.incremental import Analyzer

__all__ = ["Source", "SourceCoverage", "StoreSource"]


class SourceCoverage(Protocol):
    """What a source that is not the store gave on its last read (Prometheus's series)."""

    def summary(self) -> str:
        """One line for the human output."""
        ...

    def store_warning(self) -> str | None:
        """One line when the store's records asked for beside it were not found."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """As ``--json`` and the controller's pass report give it."""
        ...


class Source(Protocol):
    """A telemetry source, as the analyzer's callers use it."""

    settings: Settings

    @property
    def kind(self) -> str:
        """ "store", "prometheus" or "mixed" (Prometheus with the store's records)."""
        ...

    @property
    def coverage(self) -> SourceCoverage | None:
        """What Prometheus gave on the last read (None: the store, or nothing read yet)."""
        ...

    def describe(self) -> str:
        """Where it reads, for messages and reports: a path or a URL."""
        ...

    def span(self, window_s: float | None = None) -> float:
        """How many seconds before ``at`` one analysis pass reads from this source."""
        ...

    def load(self, since: float | None, until: float | None) -> Frame:
        """Telemetry with timestamps in [since, until]."""
        ...

    def recent(self, span: float) -> Frame:
        """The newest *span* seconds this source holds."""
        ...

    def frame(self, at: float | None = None, *, window_s: float | None = None) -> Frame:
        """What one analysis pass at *at* (default: the newest data) reads."""
        ...

    def analyze(self, at: float | None = None, *, window_s: float | None = None) -> Analysis:
        """One analysis pass at *at* (default: the newest windows), as ``analyze`` runs it."""
        ...

    def newest(self, analyzer: Analyzer) -> Analysis:
        """The newest windows' analysis for a daemon that reads pass after pass, *analyzer*
        keeping what it read of the store between passes."""
        ...


class StoreSource:
    """guardctl's store (or a directory of ``*.jsonl``, or one file), read by the analyzer."""

    kind = "store"
    coverage: SourceCoverage | None = None  # the store reports no coverage: it is read whole

    def __init__(self, settings: Settings, path: Path | None = None) -> None:
        self.settings = settings
        self.path = path  # None: the configured store

    def describe(self) -> str:
        return str(self.path if self.path is not None else self.settings.store.root)

    def span(self, window_s: float | None = None) -> float:
        # Step records of the ranks' own history too: the store has them, cheaply.
        return engine.steps_needed(self.settings.analyze, window_s)

    def load(self, since: float | None, until: float | None) -> Frame:
        return engine.load(self.path, self.settings, since=since, until=until)

    def recent(self, span: float) -> Frame:
        # The newest hours' files, whatever this host's clock says: the store's newest data.
        return engine.load_recent(self.path, self.settings, span)

    def frame(self, at: float | None = None, *, window_s: float | None = None) -> Frame:
        span = self.span(window_s)
        return self.recent(span) if at is None else self.load(at - span, at)

    def analyze(self, at: float | None = None, *, window_s: float | None = None) -> Analysis:
        return engine.analyze(self.path, self.settings, at, window_s=window_s)

    def newest(self, analyzer: Analyzer) -> Analysis:
        # The incremental analyzer reads only what was written since its previous pass.
        return analyzer.analyze()
