"""Scoring the analyzer against a simulated trace's truth: precision, recall, time to detect.

The trace is read once; the analyzer is then run as an operator's timer would,
every ``step_s`` seconds, and each pass's suspects are compared with the truth:
a fault's node is *detected* at the first pass calling it suspect after its
onset; any other suspect, in any pass (a faulty node before its onset
included), is a false positive.

Fabric localisation (:func:`score_fabric`) is scored the same way on the controller's
classification: a fabric fault is localised at the first pass after its onset that names its
component; any other component named, in any pass, is a wrong one (a node's own link, for a
node fault of its port, is right).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from guardctl.analyze import SUSPECT, analyze_frame
from guardctl.analyze.frame import Frame
from guardctl.config import Settings
from guardctl.controller.classify import classify
from guardctl.sections.analyze import AnalyzeSettings
from guardctl.simulate import Truth
from guardctl.topology import Topology


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


# --- fabric localisation -----------------------------------------------------------------------

# Node faults of a node's own port: a link finding naming that node is right, not a false one.
LINK_FAULTS = frozenset({"link_downshift", "link_errors", "link_flaps"})


@dataclass
class FabricScore:
    """Localisation on one trace: the fabric faults named, wrong components, node drains.

    ``drains_*``: nodes behind a fabric fault (with no node fault of their own) that the
    controller's classification would act on at some pass: without the topology (as today)
    and with it. ``node_faults_*``: injected node faults classified as node faults.
    """

    faults: dict[str, str] = field(default_factory=dict)  # component -> fault kind
    ttl: dict[str, float] = field(default_factory=dict)  # component -> windows to localise
    wrong: set[str] = field(default_factory=set)  # components named that were not at fault
    drains_today: set[str] = field(default_factory=set)
    drains_with: set[str] = field(default_factory=set)
    node_faults_today: set[str] = field(default_factory=set)
    node_faults_with: set[str] = field(default_factory=set)
    passes: int = 0


def score_fabric(
    frame: Frame, truth: Truth, settings: Settings, topology: Topology, step_s: float = 60.0
) -> FabricScore:
    """Run the analyzer and the classification, with and without *topology*, every *step_s*
    over the trace and score the fabric findings against *truth*."""
    cfg = settings.analyze
    out = FabricScore(faults={i.component: i.kind for i in truth.fabric})
    onset = {i.component: i.onset for i in truth.fabric}
    right_links = {f"link:{i.node}" for i in truth.faults if i.kind in LINK_FAULTS}
    own = {i.node for i in truth.faults}
    behind = {n for i in truth.fabric for n in i.nodes if n not in own}
    for at in np.arange(truth.start + cfg.window_s, truth.end + 1e-9, step_s):
        analysis = analyze_frame(frame, cfg, at=float(at))
        today = classify(analysis, settings.control)
        found = classify(analysis, settings.control, topology=topology)
        out.passes += 1
        for f in found.fabric:
            if f.component in out.faults and at >= onset[f.component]:
                out.ttl.setdefault(f.component, (at - onset[f.component]) / cfg.window_s)
            elif f.component not in right_links:
                out.wrong.add(f.component)
        for mine, drains, kept in (
            (today, out.drains_today, out.node_faults_today),
            (found, out.drains_with, out.node_faults_with),
        ):
            acted = {x.node for x in mine.findings if x.kind == "persistent"}
            drains |= acted & behind
            kept |= acted & own
    return out
