"""Analyzer verdicts and the agents' health as a node-exporter textfile (``guardctl_*`` metrics).

The metrics are built with prometheus_client (its metric families and text
exposition, escaping included). node_exporter's textfile collector reads every
``*.prom`` file in its directory at each scrape and would scrape a half-written
one as garbage, so the file is written beside its final name, synced, made
readable to node_exporter's user and renamed over it (:func:`guardctl.fileio.atomic_write`;
prometheus_client's ``write_to_textfile`` renames too, but neither syncs nor
sets the mode first). Beside the verdicts come each node's collectors
as node_exporter reports its own (``..._collector_success``,
``..._collector_duration_seconds``), from the agents' health records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from guardctl.analyze import SUSPECT, UNKNOWN, WATCH, Analysis, analyze_frame, health
from guardctl.analyze.engine import load_recent, steps_needed
from guardctl.fileio import atomic_write
from guardctl.sources import Source, prometheus_frame

_VERDICTS = ("healthy", UNKNOWN, SUSPECT, WATCH)


@dataclass(frozen=True)
class Export:
    """What one export holds: an analysis pass and the newest health of every collector."""

    analysis: Analysis
    collectors: Sequence[health.CollectorStatus] = ()


def collect(source: Source) -> Export:
    """One analysis pass over *source*, and the collectors' health it read."""
    settings = source.settings
    if source.url:
        frame = prometheus_frame(source)
    else:
        frame = load_recent(source.store, settings, steps_needed(settings.analyze))
    return Export(analyze_frame(frame, settings.analyze), health.latest(frame))


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class _Metrics(Collector):
    """The families of one export, for a registry of its own (never the process's global one)."""

    def __init__(self, export: Export) -> None:
        self.export = export

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from _verdicts(self.export.analysis)
        yield from _pass(self.export.analysis)
        yield from _collectors(self.export.collectors)


def _verdicts(result: Analysis) -> Iterator[GaugeMetricFamily]:
    per_node = [
        ("guardctl_node_suspect", "1 when the analyzer holds the node suspect.",
         lambda n: float(n.verdict == SUSPECT)),
        ("guardctl_node_unknown",
         "1 when the node's telemetry cannot support a verdict (too little of it, too short a "
         "run, ranks with nothing to compare with) or a collector fails.",
         lambda n: float(n.verdict == UNKNOWN)),
        ("guardctl_node_watch", "1 when the node is flagged but not yet in enough windows.",
         lambda n: float(n.verdict == WATCH)),
        ("guardctl_node_score",
         "Largest severity among the node's findings (1 = at a detector threshold).",
         lambda n: n.score),
        ("guardctl_node_flagged_windows", "Recent windows in which a detector flagged the node.",
         lambda n: float(n.flagged_windows)),
    ]  # fmt: skip
    for name, doc, value in per_node:
        family = _gauge(name, doc, ["node"])
        for n in result.nodes:
            family.add_metric([n.node], value(n))
        yield family
    gpu = _gauge(
        "guardctl_gpu_finding_severity",
        "Severity of a finding on one GPU, per detector (newest flagged window).",
        ["node", "gpu", "detector"],
    )
    for n in result.nodes:
        seen: set[tuple[int, str]] = set()
        for e in n.evidence:
            if e.gpu is not None and (e.gpu, e.detector) not in seen:
                seen.add((e.gpu, e.detector))
                gpu.add_metric([n.node, str(e.gpu), e.detector], e.severity)
    yield gpu


def _pass(result: Analysis) -> Iterator[GaugeMetricFamily]:
    nodes = _gauge("guardctl_analyze_nodes", "Nodes per verdict in the last analysis.", ["verdict"])
    for verdict in _VERDICTS:
        nodes.add_metric([verdict], float(sum(n.verdict == verdict for n in result.nodes)))
    yield nodes
    end = _gauge("guardctl_analyze_window_end_seconds",
                 "End of the newest analysis window (Unix time).")  # fmt: skip
    end.add_metric([], result.window_end)
    yield end
    records = _gauge("guardctl_analyze_input_records", "Valid records read by the last pass.")
    records.add_metric([], float(result.records))
    yield records
    bad = _gauge("guardctl_analyze_bad_lines", "Input lines skipped by the last pass, per reason.",
                 ["reason"])  # fmt: skip
    for reason, count in sorted(result.bad.items()):
        bad.add_metric([reason], float(count))
    yield bad


def _collectors(statuses: Sequence[health.CollectorStatus]) -> Iterator[GaugeMetricFamily]:
    success = _gauge(
        "guardctl_agent_collector_success",
        "1 when the collector's last sample on the node succeeded (from the agent's records).",
        ["node", "collector"],
    )
    duration = _gauge(
        "guardctl_agent_collector_duration_seconds",
        "How long the collector's last sample on the node took.",
        ["node", "collector"],
    )
    last = _gauge(
        "guardctl_agent_collector_last_sample_seconds",
        "When the agent last reported on the collector (Unix time).",
        ["node", "collector"],
    )
    for s in statuses:
        labels = [s.node, s.collector]
        success.add_metric(labels, float(s.ok))
        duration.add_metric(labels, s.duration_s)
        last.add_metric(labels, s.ts)
    yield from (success, duration, last)


def _registry(export: Export | Analysis) -> CollectorRegistry:
    if isinstance(export, Analysis):
        export = Export(export)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Metrics(export))
    return registry


def prometheus_text(export: Export | Analysis) -> str:
    """The export (or an analysis alone) in Prometheus text exposition format."""
    return generate_latest(_registry(export)).decode("utf-8")


def write_prometheus(export: Export | Analysis, path: Path) -> None:
    """Export to the textfile *path* atomically."""
    atomic_write(path, prometheus_text(export))
