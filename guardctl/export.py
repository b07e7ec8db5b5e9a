"""Analyzer verdicts as a node-exporter textfile (``guardctl_*`` metrics), written atomically.

node_exporter's textfile collector reads every ``*.prom`` file in its
directory at each scrape; a half-written file would be scraped as garbage, so
the file is written beside its final name and renamed over it.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from guardctl.analyze import SUSPECT, UNKNOWN, Analysis
from guardctl.errors import StoreError

_VERDICTS = ("healthy", UNKNOWN, SUSPECT)


def _label(value: object) -> str:
    text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def _value(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, **labels: object) -> None:
        self.lines.append(f"{name}{_labels(**labels)} {_value(value)}")


def prometheus_text(result: Analysis) -> str:
    """The analysis as Prometheus text exposition format."""
    t = _Text()
    t.family("guardctl_node_suspect", "gauge", "1 when the analyzer holds the node suspect.")
    for n in result.nodes:
        t.sample("guardctl_node_suspect", float(n.verdict == SUSPECT), node=n.node)
    t.family(
        "guardctl_node_unknown",
        "gauge",
        "1 when the node had too little telemetry in the newest window.",
    )
    for n in result.nodes:
        t.sample("guardctl_node_unknown", float(n.verdict == UNKNOWN), node=n.node)
    t.family(
        "guardctl_node_score",
        "gauge",
        "Largest severity among the node's findings (1 = at a detector threshold).",
    )
    for n in result.nodes:
        t.sample("guardctl_node_score", n.score, node=n.node)
    t.family(
        "guardctl_node_flagged_windows",
        "gauge",
        "Recent windows in which a detector flagged the node.",
    )
    for n in result.nodes:
        t.sample("guardctl_node_flagged_windows", float(n.flagged_windows), node=n.node)
    t.family(
        "guardctl_gpu_finding_severity",
        "gauge",
        "Severity of a finding on one GPU, per detector (newest flagged window).",
    )
    for n in result.nodes:
        seen: set[tuple[int, str]] = set()
        for e in n.evidence:
            if e.gpu is not None and (e.gpu, e.detector) not in seen:
                seen.add((e.gpu, e.detector))
                t.sample(
                    "guardctl_gpu_finding_severity",
                    e.severity,
                    node=n.node,
                    gpu=e.gpu,
                    detector=e.detector,
                )
    t.family("guardctl_analyze_nodes", "gauge", "Nodes per verdict in the last analysis.")
    for verdict in _VERDICTS:
        t.sample(
            "guardctl_analyze_nodes",
            float(sum(n.verdict == verdict for n in result.nodes)),
            verdict=verdict,
        )
    t.family(
        "guardctl_analyze_window_end_seconds",
        "gauge",
        "End of the newest analysis window (Unix time).",
    )
    t.sample("guardctl_analyze_window_end_seconds", result.window_end)
    t.family("guardctl_analyze_input_records", "gauge", "Valid records read by the last pass.")
    t.sample("guardctl_analyze_input_records", float(result.records))
    t.family(
        "guardctl_analyze_bad_lines", "gauge", "Input lines skipped by the last pass, per reason."
    )
    for reason, count in sorted(result.bad.items()):
        t.sample("guardctl_analyze_bad_lines", float(count), reason=reason)
    return "\n".join(t.lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write *text* to *path* via a temporary file in the same directory and a rename."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise StoreError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # node_exporter usually runs as another user
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise StoreError(f"{path}: cannot write: {exc.strerror}") from None


def write_prometheus(result: Analysis, path: Path) -> None:
    """Export *result* to the textfile *path* atomically."""
    write_atomic(path, prometheus_text(result))
