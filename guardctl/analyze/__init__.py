"""The analyzer: finds grey (slow) nodes in schema-v1 telemetry, one verdict per node.

Entry points: :func:`analyze` (one pass over the store or a path, as
``guardctl analyze`` runs it), :func:`load` + :func:`analyze_frame` (read once,
judge at many points in time, as reports and benchmarks do).
"""

from guardctl.analyze.engine import (
    HEALTHY,
    SUSPECT,
    UNKNOWN,
    VERDICTS,
    WATCH,
    Analysis,
    Evidence,
    NodeVerdict,
    analyze,
    analyze_frame,
    history_needed,
    load,
    steps_needed,
    thresholds,
)
from guardctl.analyze.frame import Frame

__all__ = [
    "HEALTHY",
    "SUSPECT",
    "UNKNOWN",
    "VERDICTS",
    "WATCH",
    "Analysis",
    "Evidence",
    "Frame",
    "NodeVerdict",
    "analyze",
    "analyze_frame",
    "history_needed",
    "load",
    "steps_needed",
    "thresholds",
]
