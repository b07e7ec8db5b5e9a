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

And what to alert on, from the store (docs/prometheus.md lists them, contrib/prometheus has
rules): each controller host's last pass (``guardctl_control_*``: when, how long, whether it
led, acted, observed only or was held back, or failed; from the files
:func:`guardctl.controller.record.write_pass` rewrites each pass), the action log's counts
(node actions by outcome, the controller's decisions by outcome, refusals included, sweep
verdicts, observe-only's paper steps, failing hooks, intents a crash left open), the fabric
findings open in it (``guardctl_fabric_finding*``: a leaf switch, an uplink, a spine group or a
node's link at fault, with its confidence and its nodes), and whether the store can be written.
The export is the one exporter: a controller that stopped passing is seen by the pass time it
no longer advances.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from guardctl.actionlog import ActionLog, Entry, pending_intents
from guardctl.analyze import SUSPECT, UNKNOWN, WATCH, Analysis, analyze_frame, health
from guardctl.errors import StoreError
from guardctl.fileio import atomic_write
from guardctl.nodeops.ownership import REQUEUE
from guardctl.storage.source import Source

Family = GaugeMetricFamily | CounterMetricFamily

_VERDICTS = ("healthy", UNKNOWN, SUSPECT, WATCH)
_NODE_ACTIONS = ("drain", "resume", "quarantine", "release", REQUEUE)


@dataclass(frozen=True)
class Export:
    """What one export holds: an analysis pass and the newest health of every collector."""

    analysis: Analysis
    collectors: Sequence[health.CollectorStatus] = ()
    store: StoreState | None = None  # the controller, the action log, the store (None: not read)


@dataclass(frozen=True)
class StoreState:
    """What the store says about guardctl itself: its controllers' passes, its action log."""

    passes: Sequence[Mapping[str, Any]] = ()
    entries: Sequence[Entry] = ()
    log_readable: bool = True
    writable: bool = True
    problems: Sequence[str] = field(default_factory=list)


def collect(source: Source) -> Export:
    """One analysis pass over *source*, the collectors' health it read, and the store's."""
    settings = source.settings
    frame = source.frame()
    return Export(
        analyze_frame(frame, settings.analyze),
        health.latest(frame),
        store_state(settings.store.root),
    )


def store_state(root: Path) -> StoreState:
    """The controllers' last passes and the action log under *root*, and whether a file can be
    created there (what every writer needs: a read-only or root-squashed mount says no)."""
    from guardctl.controller.record import read_passes

    problems = []
    try:
        entries: Sequence[Entry] = ActionLog(root).entries()
        readable = True
    except StoreError as exc:
        entries, readable = [], False
        problems.append(str(exc))
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".guardctl-export-"):
            writable = True
    except OSError as exc:
        writable = False
        problems.append(f"cannot write in the store {root}: {exc.strerror or exc}")
    return StoreState(read_passes(root), entries, readable, writable, problems)


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class _Metrics(Collector):
    """The families of one export, for a registry of its own (never the process's global one)."""

    def __init__(self, export: Export) -> None:
        self.export = export

    def collect(self) -> Iterator[Family]:
        yield from _verdicts(self.export.analysis)
        yield from _pass(self.export.analysis)
        yield from _collectors(self.export.collectors)
        if self.export.store is not None:
            yield from _controller(self.export.store.passes)
            yield from _log(self.export.store)
            yield from _fabric(self.export.store.entries)


def _verdicts(result: Analysis) -> Iterator[GaugeMetricFamily]:
    per_node = [
        (
            "guardctl_node_suspect",
            "1 when the analyzer holds the node suspect.",
            lambda n: float(n.verdict == SUSPECT),
        ),
        (
            "guardctl_node_unknown",
            "1 when the node's telemetry cannot support a verdict (too little of it, too short a "
            "run, ranks with nothing to compare with) or a collector fails.",
            lambda n: float(n.verdict == UNKNOWN),
        ),
        (
            "guardctl_node_watch",
            "1 when the node is flagged but not yet in enough windows.",
            lambda n: float(n.verdict == WATCH),
        ),
        (
            "guardctl_node_score",
            "Largest severity among the node's findings (1 = at a detector threshold).",
            lambda n: n.score,
        ),
        (
            "guardctl_node_flagged_windows",
            "Recent windows in which a detector flagged the node.",
            lambda n: float(n.flagged_windows),
        ),
    ]
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
    end = _gauge(
        "guardctl_analyze_window_end_seconds", "End of the newest analysis window (Unix time)."
    )
    end.add_metric([], result.window_end)
    yield end
    records = _gauge("guardctl_analyze_input_records", "Valid records read by the last pass.")
    records.add_metric([], float(result.records))
    yield records
    bad = _gauge(
        "guardctl_analyze_bad_lines",
        "Input lines skipped by the last pass, per reason.",
        ["reason"],
    )
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


def _controller(passes: Sequence[Mapping[str, Any]]) -> Iterator[GaugeMetricFamily]:
    """Each controller host's last pass: its liveness, and whether it acts."""
    per_host = [
        (
            "guardctl_control_last_pass_seconds",
            "When the controller's last pass ended (Unix "
            "time); a pass that failed counts (see guardctl_control_pass_failed).",
            lambda p: float(p["ts"]),
        ),
        (
            "guardctl_control_pass_duration_seconds",
            "How long the controller's last pass took.",
            lambda p: float(p.get("duration_s") or 0.0),
        ),
        (
            "guardctl_control_interval_seconds",
            "The controller's time between passes.",
            lambda p: float(p.get("interval_s") or 0.0),
        ),
        (
            "guardctl_control_pass_failed",
            "1 when the last pass failed (Slurm down, the "
            "telemetry source, the lease lost mid-pass): nothing was decided after the failure.",
            lambda p: float(bool(p.get("error"))),
        ),
        (
            "guardctl_control_leader",
            "1 when the controller held the leader lease at its last "
            "pass (exactly one host should).",
            lambda p: float(bool(p.get("leader"))),
        ),
        (
            "guardctl_control_acting",
            "1 when the last pass acted on Slurm; 0: it observed only "
            "(configured so, not the leader, or held back).",
            lambda p: float(bool(p.get("acting"))),
        ),
        (
            "guardctl_control_observe_only",
            "1 when the controller is configured to observe only "
            "(safety.observe_only, or guardctl control without --act).",
            lambda p: float(bool(p.get("observe_only"))),
        ),
    ]
    for name, doc, value in per_host:
        family = _gauge(name, doc, ["host"])
        for p in passes:
            family.add_metric([str(p.get("host", ""))], value(p))
        yield family
    held = _gauge(
        "guardctl_control_held_back",
        "1 when the leader's last pass was held back from acting, and why: clock_skew "
        "(an agent's clock too far from the controller's) or window (the newest "
        "analysis window stale or in the future: nothing decided).",
        ["host", "why"],
    )
    for p in passes:
        host = str(p.get("host", ""))
        held.add_metric([host, "clock_skew"], float(bool(p.get("held_back"))))
        held.add_metric([host, "window"], float(bool(p.get("refused"))))
    yield held


def _word(outcome: str) -> str:
    """An outcome's first word or words, as a label ("refused: ..." -> refused)."""
    head = re.split(r"[:;,(]", outcome, maxsplit=1)[0].strip().lower()
    return re.sub(r"[^a-z0-9]+", "_", head).strip("_") or "none"


def _log(state: StoreState) -> Iterator[Family]:
    """Counts over the action log as it is (a checkpoint that shrinks it reads as a reset)."""
    entries = state.entries
    families: list[tuple[str, str, list[str], Counter[tuple[str, ...]]]] = [
        (
            "guardctl_node_actions",
            "Node actions in the action log, by action and outcome (done, "
            "failed, reconciled, abandoned).",
            ["action", "outcome"],
            Counter(
                (e.action, e.phase)
                for e in entries
                if e.phase not in ("intent", "note") and e.action in _NODE_ACTIONS
            ),
        ),
        (
            "guardctl_control_decisions",
            "The controller's recorded decisions, by decision and "
            "outcome (done, would_do, refused, skipped, failed, swept, ...).",
            ["decision", "outcome"],
            Counter(
                (str(e.evidence.get("decision", "")), _word(str(e.evidence.get("outcome", ""))))
                for e in entries
                if e.action == "control decision"
            ),
        ),
        (
            "guardctl_control_sweeps",
            "The controller's judged sweeps, by verdict (pass, fail, undetermined, aborted).",
            ["verdict"],
            Counter(
                (str(e.evidence.get("verdict", "")),)
                for e in entries
                if e.action == "control sweep"
            ),
        ),
        (
            "guardctl_control_rehearsal_steps",
            "Observe-only's paper steps (what the controller would have done), by step.",
            ["step"],
            Counter(
                (str(e.evidence.get("step", "")),)
                for e in entries
                if e.action == "control rehearsal"
            ),
        ),
        (
            "guardctl_hook_failures",
            "Failing prolog/epilog/health-check runs noted in the log, by "
            "hook and whether guardctl drained the node.",
            ["hook", "drained"],
            Counter(
                (str(e.evidence.get("hook", "")), str(bool(e.evidence.get("drained"))).lower())
                for e in entries
                if e.action == "hook failed"
            ),
        ),
    ]
    for name, doc, labels, counts in families:
        family = CounterMetricFamily(name, doc, labels=labels)
        for key, n in sorted(counts.items()):
            family.add_metric(list(key), float(n))
        yield family
    intents = _gauge(
        "guardctl_action_intents_open",
        "Intents with no outcome (a crash mid-action): the next acting command reconciles them.",
    )
    intents.add_metric([], float(len(pending_intents(entries))))
    yield intents
    for name, doc, ok in (
        (
            "guardctl_action_log_readable",
            "1 when the action log could be read.",
            state.log_readable,
        ),
        (
            "guardctl_store_writable",
            "1 when a file could be created in the store (every writer "
            "needs it: agents, hooks, the controller's log and lease).",
            state.writable,
        ),
    ):
        gauge = _gauge(name, doc)
        gauge.add_metric([], float(ok))
        yield gauge


def _fabric(entries: Sequence[Entry]) -> Iterator[GaugeMetricFamily]:
    """The fabric findings open in the controller's log, one series each per component."""
    from guardctl.controller.fabric import fabric_now

    labels = ["component", "kind"]
    families = [
        (
            _gauge(
                "guardctl_fabric_finding",
                "1 for each fabric component the controller holds at fault now (a leaf "
                "switch, an uplink, a spine group or a node's link; no node action for it).",
                labels,
            ),
            lambda _f: 1.0,
        ),
        (
            _gauge(
                "guardctl_fabric_finding_confidence",
                "How sure the localisation is that the component is at fault (0..1).",
                labels,
            ),
            lambda f: float(f.get("confidence") or 0.0),
        ),
        (
            _gauge(
                "guardctl_fabric_finding_nodes",
                "The nodes whose traffic goes through the component at fault.",
                labels,
            ),
            lambda f: float(len(f.get("nodes") or ())),
        ),
        (
            _gauge(
                "guardctl_fabric_quarantined_nodes",
                "Nodes the controller holds quarantined for the component "
                "(control.fabric_quarantine).",
                labels,
            ),
            lambda f: float(len(f.get("quarantined") or ())),
        ),
    ]
    found = fabric_now(entries)
    for family, value in families:
        for f in found:
            family.add_metric([str(f.get("component", "")), str(f.get("kind", ""))], value(f))
        yield family


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
