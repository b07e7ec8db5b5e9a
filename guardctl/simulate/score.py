"""Scoring the analyzer against a simulated trace's truth: precision, recall, time to detect.

The trace is read once; the analyzer is then run as an operator's timer would,
every ``step_s`` seconds, and each pass's suspects are compared with the truth:
a fault's node is *detected* at the first pass calling it suspect after its
onset; any other suspect, in any pass (a faulty node before its onset
included), is a false positive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from guardctl.analyze import SUSPECT, analyze_frame
from guardctl.analyze.frame import Frame
from guardctl.sections.analyze import AnalyzeSettings
from guardctl.simulate import Truth


@dataclass
class Score:
    """The outcome of one trace."""

    faults: int = 0
    detected: int = 0  # faults found by the end of the trace
    false_nodes: set[str] = field(default_factory=set)  # healthy nodes ever called suspect
    false_passes: int = 0  # (pass, node) pairs wrongly suspect
    passes: int = 0
    ttd: dict[str, float] = field(default_factory=dict)  # node -> windows, per detected fault
    missed: list[str] = field(default_factory=list)

    @property
    def ttd_windows(self) -> list[float]:
        return list(self.ttd.values())

    @property
    def precision(self) -> float:
        called = self.detected + len(self.false_nodes)
        return self.detected / called if called else 1.0

    @property
    def recall(self) -> float:
        return self.detected / self.faults if self.faults else 1.0


def score_trace(frame: Frame, truth: Truth, cfg: AnalyzeSettings, step_s: float = 60.0) -> Score:
    """Run the analyzer every *step_s* over the trace and score it against *truth*."""
    faulty = truth.faulty
    score = Score(faults=len(faulty))
    first: dict[str, float] = {}
    start = truth.start + cfg.window_s
    for at in np.arange(start, truth.end + 1e-9, step_s):
        result = analyze_frame(frame, cfg, at=float(at))
        score.passes += 1
        for verdict in result.nodes:
            if verdict.verdict != SUSPECT:
                continue
            inj = faulty.get(verdict.node)
            if inj is not None and at >= inj.onset:
                first.setdefault(verdict.node, float(at))
            else:
                score.false_passes += 1
                score.false_nodes.add(verdict.node)
    for node, inj in faulty.items():
        if node in first:
            score.detected += 1
            score.ttd[node] = (first[node] - inj.onset) / cfg.window_s
        else:
            score.missed.append(f"{node}:{inj.kind}")
    return score
