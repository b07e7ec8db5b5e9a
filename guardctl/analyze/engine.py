"""The analysis pass: detectors over the last n windows, persistence, and one verdict per node.

A node is ``suspect`` when some detector flagged it in at least ``persist_k``
of the last ``persist_n`` windows (windows without enough of its data do not
count), ``watch`` when flagged in fewer (not persistent yet), ``unknown`` when
its telemetry cannot support a verdict: the newest window holds too little of
its data, one of its agent's collectors fails there
(:mod:`guardctl.analyze.health`), fewer than ``persist_k`` windows hold enough
of its data (too short a run to judge), or its ranks had no peers to compare
with and no history of their own; ``healthy`` otherwise. Its ``score`` is the
largest severity among its flags (>= 1 means past a threshold), so reports can
rank nodes.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from guardctl.analyze import features as feat
from guardctl.analyze import health, slowdown, stages
from guardctl.analyze.detectors import Flags, load_all
from guardctl.analyze.frame import Frame, cut, newest_per_node
from guardctl.analyze.impact import job_impact
from guardctl.analyze.load import read_frame, segment_groups
from guardctl.config import Settings
from guardctl.errors import ConfigError
from guardctl.sections.analyze import AnalyzeSettings
from guardctl.storage import segments
from guardctl.telemetry import schema

HEALTHY, SUSPECT, UNKNOWN, WATCH = "healthy", "suspect", "unknown", "watch"
VERDICTS = (SUSPECT, WATCH, UNKNOWN, HEALTHY)  # the order summaries count them in


@dataclass(frozen=True)
class Evidence:
    """One reason's numbers: what was measured, against what, and how far off."""

    detector: str
    metric: str
    unit: str
    value: float
    reference: float
    deviation: float | None  # relative to the reference; None where it has no meaning
    severity: float
    window_start: float
    window_end: float
    gpu: int | None = None
    device: str | None = None  # NIC "<device>:<port>"
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "detector": self.detector,
            "metric": self.metric,
            "unit": self.unit,
            "value": _num(self.value),
            "reference": _num(self.reference),
            "deviation": _num(self.deviation),
            "severity": _num(self.severity),
            "window": {"start": self.window_start, "end": self.window_end},
        }
        for key in ("gpu", "device", "rank"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class NodeVerdict:
    """The analyzer's judgement of one node."""

    node: str
    verdict: str
    score: float
    reasons: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    flagged_windows: int = 0
    job: str | None = None
    impact: dict[str, Any] | None = None  # what the node costs its job (analyze.impact)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "verdict": self.verdict,
            "score": self.score,
            "reasons": list(self.reasons),
            "gpus": list(self.gpus),
            "evidence": [e.to_dict() for e in self.evidence],
            "flagged_windows": self.flagged_windows,
            "job": self.job,
            "impact": self.impact,
        }


@dataclass(frozen=True)
class Analysis:
    """The result of one pass: the newest window, every node's verdict, what was read."""

    window_start: float
    window_end: float
    nodes: tuple[NodeVerdict, ...]
    files: int = 0
    records: int = 0
    bad: dict[str, int] = field(default_factory=dict)
    persist: tuple[int, int] = (2, 3)
    # Job-level findings: a pipeline stage heavier on every replica (never a node's fault).
    stages: tuple[stages.StageImbalance, ...] = ()
    # Nodes whose newest record is stamped after now plus ``control.max_clock_skew_s`` (a
    # clock ahead): node -> that record's time. Ignored for where the window ends.
    ahead: dict[str, float] = field(default_factory=dict)
    # Each job's step time against its own history: a job slowed on every rank alike is the
    # job's finding (never a node's), one too young for a baseline is unknown.
    jobs: tuple[slowdown.JobPace, ...] = ()

    def counts(self) -> dict[str, int]:
        """Nodes per verdict, every verdict present (in ``VERDICTS`` order)."""
        found = Counter(n.verdict for n in self.nodes)
        return {v: found[v] for v in VERDICTS}

    @property
    def suspects(self) -> list[NodeVerdict]:
        return [n for n in self.nodes if n.verdict == SUSPECT]

    def verdict_of(self, node: str) -> NodeVerdict | None:
        return next((n for n in self.nodes if n.node == node), None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bad", {k: int(v) for k, v in sorted(self.bad.items()) if v})

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "window": {"start": self.window_start, "end": self.window_end},
            "persist": {"k": self.persist[0], "n": self.persist[1]},
            "nodes": [n.to_dict() for n in self.nodes],
            "summary": self.counts(),
            "input": {"files": self.files, "records": self.records, "bad": dict(self.bad)},
            "stages": [s.to_dict() for s in self.stages],
            "ahead": dict(self.ahead),
            "jobs": [j.to_dict() for j in self.jobs],
        }

    @property
    def slowed(self) -> list[slowdown.JobPace]:
        """The jobs slower than their own history on every rank alike."""
        return [j for j in self.jobs if j.verdict == slowdown.SLOWED]


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), 4)


def thresholds(cfg: AnalyzeSettings) -> dict[str, dict[str, float]]:
    """Every registered detector's thresholds: defaults overlaid with the configuration.

    An unknown detector or key is a configuration error (a typo must not silently
    leave a default in force). ``enabled = 0`` switches a detector off.
    """
    registry = load_all()
    out: dict[str, dict[str, float]] = {}
    for name, det in registry.items():
        out[name] = {"enabled": 1.0, **det.defaults}
    for name, table in cfg.detectors.items():
        if name not in out:
            raise ConfigError(
                f"analyze.detectors.{name}: unknown detector (known: {', '.join(sorted(out))})"
            )
        for key, value in table.items():
            if key not in out[name]:
                raise ConfigError(
                    f"analyze.detectors.{name}.{key}: unknown threshold "
                    f"(known: {', '.join(sorted(out[name]))})"
                )
            out[name][key] = float(value)
    return out


def run_detectors(f: feat.Features, cfg: AnalyzeSettings) -> list[Flags]:
    """Every enabled detector's flags, in the registry's order. Several at a time
    (``[analyze] threads``): they only read the tables, and their sorts let go of the
    interpreter (a pass a minute at 100k GPUs spends 0.4 s here on one thread)."""
    registry = load_all()
    enabled = [(registry[name], th) for name, th in thresholds(cfg).items() if th["enabled"]]
    with ThreadPoolExecutor(cfg.pass_threads()) as pool:
        found = list(pool.map(lambda item: item[0].detect(f, item[1]), enabled))
    return [fl for flags in found for fl in flags if len(fl)]


def default_at(frame: Frame, window_s: float, until: float | None = None) -> float | None:
    """Where the newest window ends: the newest record, ignoring a node far ahead of the rest.

    A node whose clock (or a corrupt record) lies far in the future must not
    move everyone's window past their data: neither one far ahead of the other
    nodes, nor one whose newest record is after *until* (now plus the tolerance).
    """
    return _end_of(newest_per_node(frame), window_s, until)


def _end_of(per_node: np.ndarray | None, window_s: float, until: float | None) -> float | None:
    if per_node is None:
        return None
    per_node = per_node[np.isfinite(per_node)]
    if until is not None:
        per_node = per_node[per_node <= until]
    if not per_node.size:
        return None
    limit = float(np.median(per_node)) + window_s
    return float(per_node[per_node <= limit].max())


def ahead_of(frame: Frame, until: float) -> dict[str, float]:
    """The nodes whose newest record is stamped after *until*: node -> that record's time."""
    return _ahead_of(frame.nodes, newest_per_node(frame), until)


def _ahead_of(nodes: list[str], per_node: np.ndarray | None, until: float) -> dict[str, float]:
    if per_node is None:
        return {}
    return {nodes[i]: float(per_node[i]) for i in np.flatnonzero(per_node > until)}


def until_now(settings: Settings, now: float | None = None) -> float:
    """The newest time a record may be stamped and still count: now (this host's clock, or
    *now*) plus the clock skew tolerated between hosts, ``control.max_clock_skew_s``."""
    return (time.time() if now is None else now) + settings.control.max_clock_skew_s


# A window that ended more than this many window lengths ago is stale: the telemetry stopped.
STALE_WINDOWS = 2


def out_of_date(analysis: Analysis, now: float, tolerance_s: float) -> str | None:
    """Why nothing may be done on *analysis* at *now*, in one line: its newest window ended
    more than ``STALE_WINDOWS`` window lengths (and the tolerance) ago, or ends after now plus
    the tolerance; None when it is current, or when there is no window at all."""
    end, length = analysis.window_end, analysis.window_end - analysis.window_start
    if not math.isfinite(end):
        return None
    if end > now + tolerance_s:
        return (
            f"the newest window ends {end - now:.0f} s after this host's clock (beyond "
            f"control.max_clock_skew_s={tolerance_s:g}): its data cannot be current"
        )
    if now - end > STALE_WINDOWS * length + tolerance_s:
        return (
            f"stale telemetry: the newest window ended {_span(now - end)} ago (more than "
            f"{STALE_WINDOWS} windows of {length:g} s)"
        )
    return None


def ahead_line(analysis: Analysis, now: float) -> str | None:
    """One line on the nodes stamping records ahead of this host's clock, or None."""
    if not analysis.ahead:
        return None
    names = sorted(analysis.ahead)
    most = max(analysis.ahead.values()) - now
    listed = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"{len(names)} node(s) stamp records up to {_span(most)} ahead of this host's "
        f"clock, ignored for where the window ends: {listed}"
    )


def _span(seconds: float) -> str:
    if abs(seconds) >= 72000:
        return f"{seconds / 86400:.1f} days"
    if abs(seconds) >= 1000:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:.0f} s"


def _node_flags(
    flags: list[Flags], n_nodes: int, n_windows: int, has_data: np.ndarray
) -> np.ndarray:
    """(n_windows, n_nodes) whether any detector flagged the node in the window."""
    hit = np.zeros((n_windows, n_nodes), bool)
    for fl in flags:
        hit[fl.w, fl.node] = True
    return hit & has_data


def analyze_frame(
    frame: Frame,
    cfg: AnalyzeSettings,
    *,
    at: float | None = None,
    window_s: float | None = None,
    until: float | None = None,
) -> Analysis:
    """Judge every node seen in *frame* over the windows ending at *at* (default: newest data,
    none after *until*, whose nodes are reported in ``ahead``)."""
    window_s = window_s or cfg.window_s
    ahead: dict[str, float] = {}
    if at is None:  # (each node's newest record: found once, for both)
        newest = newest_per_node(frame)
        ahead = _ahead_of(frame.nodes, newest, until) if until is not None else {}
        at = _end_of(newest, window_s, until)
    if at is None:
        return nothing_judged((frame.files, frame.records_read, dict(frame.bad)), cfg, ahead)
    f = feat.extract(frame, at, window_s, cfg.persist_n, **feature_settings(cfg))
    return judge(frame, f, cfg, ahead)


def nothing_judged(
    counts: tuple[int, int, dict[str, int]], cfg: AnalyzeSettings, ahead: dict[str, float]
) -> Analysis:
    """The analysis when no window can be judged (no records, or none in time); *counts*:
    the input's files, records and bad lines."""
    return Analysis(math.nan, math.nan, (), *counts, (cfg.persist_k, cfg.persist_n), ahead=ahead)


def feature_settings(cfg: AnalyzeSettings) -> dict[str, Any]:
    """The settings :func:`features.extract` takes, from the ``[analyze]`` section."""
    return {
        "min_samples": cfg.min_samples,
        "min_coverage": cfg.min_coverage,
        "min_peers": cfg.min_peers,
        "min_rank_peers": cfg.min_rank_peers,
        "own_history": cfg.own_history,
        "low_q": cfg.low_quantile,
        "hw_xids": cfg.hardware_xids,
        "job_paces": cfg.job_slowdown > 0,
        "threads": cfg.pass_threads(),
    }


def judge(
    frame: Frame, f: feat.Features, cfg: AnalyzeSettings, ahead: dict[str, float]
) -> Analysis:
    """Every node's verdict, the stages and the jobs' slowdowns, from *frame*'s features *f*
    (*ahead*: the nodes with records stamped after the time asked for)."""
    n, at, window_s = cfg.persist_n, f.at, f.window_s
    flags = run_detectors(f, cfg)
    hit = _node_flags(flags, len(f.nodes), n, f.has_data)
    count = hit.sum(axis=0)
    has_data = dict(zip(f.nodes, f.has_data[0].tolist(), strict=True))
    broken = health.failing(frame, at - window_s, at, has_data)
    seen = np.array(f.seen.any(axis=0), bool)  # and nodes only their agents' health is from
    seen[[i for i, name in enumerate(f.nodes) if name in broken]] = True
    unjudged = _not_compared(f, cfg)
    verdicts = []
    for node in np.flatnonzero(seen).tolist():
        why = broken.get(f.nodes[node], [])
        alone = unjudged.get(node, ())
        verdicts.append(_verdict(f, flags, hit, node, int(count[node]), cfg, why, alone))
    verdicts.sort(key=lambda v: (v.verdict != SUSPECT, -v.score, v.node))
    return Analysis(
        at - window_s,
        at,
        tuple(verdicts),
        frame.files,
        frame.records_read,
        dict(frame.bad),
        (cfg.persist_k, n),
        stages.find(f, cfg.stage_imbalance, cfg.persist_k),
        ahead,
        slowdown.find(f, hit, _pace_rule(cfg)),
    )


def _pace_rule(cfg: AnalyzeSettings) -> slowdown.Rule:
    windows = cfg.job_slowdown_windows or cfg.persist_k
    return slowdown.Rule(cfg.job_slowdown, windows, cfg.own_history, cfg.min_samples)


def _verdict(
    f: feat.Features,
    flags: list[Flags],
    hit: np.ndarray,
    node: int,
    count: int,
    cfg: AnalyzeSettings,
    failing: list[str],
    not_compared: tuple[str, ...],
) -> NodeVerdict:
    name = f.nodes[node]
    job_idx = int(f.node_job[0, node])
    job = f.jobs[job_idx] if job_idx >= 0 else None
    if failing or not f.has_data[0, node]:  # a broken collector is a gap that has a cause
        return NodeVerdict(
            name,
            UNKNOWN,
            0.0,
            tuple(failing) or ("too little data in the newest window",),
            flagged_windows=count,
            job=job,
        )
    short = _too_short(f, node, cfg)
    if not hit[:, node].any():
        unjudged = bool(not_compared) and not_compared[0].startswith(NOT_COMPARED)
        if unjudged or short:
            return NodeVerdict(name, UNKNOWN, 0.0, (*short, *not_compared), job=job)
        return NodeVerdict(name, HEALTHY, 0.0, not_compared, job=job)
    evidence = _evidence(f, flags, hit, node, cfg.evidence_per_node)
    score = round(max(e.severity for e in evidence), 2) if evidence else 0.0
    verdict = SUSPECT if count >= cfg.persist_k else WATCH
    reasons = _reasons(evidence)
    if verdict == WATCH:
        reasons = (
            f"flagged in {count} of {f.n_windows} windows (needs {cfg.persist_k}): "
            "not persistent yet",
            *short,
            *reasons,
        )
    gpus = tuple(sorted({e.gpu for e in evidence if e.gpu is not None}))
    impact = _impact(f, node, job_idx, job) if verdict == SUSPECT else None
    return NodeVerdict(name, verdict, score, reasons, gpus, tuple(evidence), count, job, impact)


def _too_short(f: feat.Features, node: int, cfg: AnalyzeSettings) -> tuple[str, ...]:
    """Why the node's telemetry is too short for persistence to decide, or nothing."""
    windows = int((f.has_data[:, node] & f.seen[:, node]).sum())  # (a window never seen: none)
    if windows >= cfg.persist_k:
        return ()
    return (
        f"too short to judge: {windows} of the last {f.n_windows} windows hold enough of "
        f"its data, a verdict needs {cfg.persist_k} (analyze.persist_k x window_s)",
    )


def _impact(f: feat.Features, node: int, job_idx: int, job: str | None) -> dict[str, Any] | None:
    """What *node* costs its job in the newest window (None without step records)."""
    t = f.rank
    if job is None or not len(t):
        return None
    rows = (t["w"] == 0) & (t["job"] == job_idx)
    mine = rows & (t["node"] == node)
    others = rows & (t["node"] != node)
    found = job_impact(
        job,
        t["compute_med"][mine].tolist(),
        t["compute_med"][others].tolist(),
        float(np.median(t["step_med"][rows])) if rows.any() else 0.0,
        int(rows.sum()),
    )
    return found.as_dict() if found is not None else None


NOT_COMPARED = "ranks not judged"
OWN_HISTORY = "ranks judged against their own history"


def _not_compared(f: feat.Features, cfg: AnalyzeSettings) -> dict[int, tuple[str, ...]]:
    """Per node whose ranks had too few peers to be compared in the newest window: say so,
    and whether their own history stood in (see the ``busy_history`` detector).

    One pass over the rank table for all nodes (per node, it was a scan of the
    whole table each: quadratic in the fleet).
    """
    t = f.rank
    if not len(t):
        return {}
    size = len(f.nodes)
    newest = t["w"] == 0
    node = t["node"]
    ranks = np.bincount(node[newest], minlength=size)
    compared = np.bincount(node[newest & (t["peer"] >= 0)], minlength=size)
    alone = np.flatnonzero((ranks > 0) & (compared == 0))
    if not alone.size:
        return {}
    rows = np.flatnonzero(newest)
    first = np.full(size, -1, np.int64)
    first[node[rows][::-1]] = rows[::-1]  # each node's first row in the newest window
    own = newest & (t["own_windows"] > 0)
    jobs, counts = np.unique(t["job"][own], return_counts=True)
    witnessed = dict(zip(jobs.tolist(), counts.tolist(), strict=True))
    has_own = np.bincount(node[own], minlength=size) > 0
    few = (
        f"fewer than {cfg.min_rank_peers} ranks doing the same work in its job (too small "
        "a job or pipeline stage to compare)"
    )
    out: dict[int, tuple[str, ...]] = {}
    for n in alone.tolist():
        seen_by = witnessed.get(int(t["job"][first[n]]), 0)
        if seen_by >= 2 and has_own[n]:
            out[n] = (f"{OWN_HISTORY}: {few}",)
        elif cfg.own_history:
            other = "other rank" if seen_by else "earlier window"
            out[n] = (f"{NOT_COMPARED}: {few}; no {other} of its own to compare with",)
        else:
            out[n] = (f"{NOT_COMPARED}: {few}",)
    return out


def _evidence(
    f: feat.Features, flags: list[Flags], hit: np.ndarray, node: int, limit: int
) -> list[Evidence]:
    """Evidence from the newest window in which the node was flagged, strongest first."""
    w = int(np.flatnonzero(hit[:, node])[0])
    start, end = f.window_bounds(w)
    out: list[tuple[tuple[Any, ...], Evidence]] = []
    for position, fl in enumerate(flags):
        rows = np.flatnonzero((fl.node == node) & (fl.w == w))
        for r in rows:
            e = Evidence(
                fl.detector,
                fl.metric,
                fl.unit,
                float(fl.value[r]),
                float(fl.reference[r]),
                None if math.isnan(fl.deviation[r]) else float(fl.deviation[r]),
                round(float(fl.severity[r]), 2),
                start,
                end,
                gpu=None if fl.gpu is None else int(fl.gpu[r]),
                device=None if fl.port is None else f.ports[int(fl.port[r])],
                rank=None if fl.rank is None else int(fl.rank[r]),
            )
            out.append((_evidence_order(e, position), e))
    out.sort(key=lambda item: item[0])
    return [e for _, e in out[:limit]]


def _evidence_order(e: Evidence, position: int) -> tuple[Any, ...]:
    """Strongest first; ties by detector, then by port name, rank and GPU.

    Names, not table indices: the order must not depend on the order in which
    the files were read (a pass that carries its tables over from earlier passes
    numbers ports and jobs differently from a cold pass).
    """
    return (-e.severity, position, e.device or "", _or(e.rank), _or(e.gpu))


def _or(x: int | None) -> int:
    return -1 if x is None else x


def _reasons(evidence: list[Evidence]) -> tuple[str, ...]:
    """One reason per detector and metric: the strongest case, and how many more there are."""
    groups: dict[tuple[str, str], list[Evidence]] = {}
    for e in evidence:  # strongest first already
        groups.setdefault((e.detector, e.metric), []).append(e)
    out = []
    for items in groups.values():
        text = _reason(items[0])
        if len(items) > 1:
            text += f" (and {len(items) - 1} more alike)"
        out.append(text)
    return tuple(out)


# Detectors whose reference is the node's own past, not its peers.
_OWN_REFERENCE = frozenset({"busy_history"})


def _reason(e: Evidence) -> str:
    where = f" GPU {e.gpu}" if e.gpu is not None and e.rank is None else ""
    where += f" rank {e.rank}" if e.rank is not None else ""
    where += f" {e.device}" if e.device else ""
    against = "its own earlier" if e.detector in _OWN_REFERENCE else "peers"
    dev = f" ({e.deviation:+.0%} vs {against} {e.reference:.4g})" if e.deviation is not None else ""
    return f"{e.detector}:{where} {e.metric} {e.value:.4g} {e.unit}{dev}"


# --- the library entry point ------------------------------------------------------------------


def load(
    path: Path | None,
    settings: Settings,
    *,
    since: float | None = None,
    until: float | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    keep_from: Mapping[str, float] | None = None,
    read_before: Sequence[Frame] = (),
) -> Frame:
    """Read the telemetry under *path* (default: the configured store) for [since, until]
    (only the segments of *groups*, files by segment, where given; per kind, only the records
    from *keep_from* on, where given: see frame.cut), joined with the frames *read_before*."""
    cfg = settings.analyze
    root = path if path is not None else settings.store.root
    return read_frame(
        root,
        groups=groups,
        since=since,
        until=until,
        closed_segments=cfg.cache,
        workers=cfg.parsers(),
        threads=cfg.pass_threads(),
        column_files=cfg.column_files,
        keep_from=keep_from,
        read_before=read_before,
    )


def history_needed(cfg: AnalyzeSettings, window_s: float | None = None) -> float:
    """How many seconds before ``at`` one pass judges (all it needs of every record kind)."""
    return (window_s or cfg.window_s) * cfg.persist_n


def steps_needed(cfg: AnalyzeSettings, window_s: float | None = None) -> float:
    """How many seconds before ``at`` a pass reads step records: the judged windows and the
    ranks' own history before them (``own_history``); a pass from the store reads this."""
    return (window_s or cfg.window_s) * (cfg.persist_n + cfg.own_history)


def cutoffs(start: float, judged: float, window_s: float) -> dict[str, float]:
    """Per kind, the time from which a pass needs its records: those of the windows it judges,
    from *judged*, and the step records from *start* less a window (a step is placed at its
    job's median time: a rank's record of it a little older still counts)."""
    out = dict.fromkeys(schema.KINDS, judged)
    out["step"] = start - window_s
    return out


def needed_from(at: float, cfg: AnalyzeSettings, window_s: float | None = None) -> dict[str, float]:
    """Per kind, the oldest record time a pass whose windows end at *at* looks at."""
    length = window_s or cfg.window_s
    return cutoffs(at - steps_needed(cfg, length), at - history_needed(cfg, length), length)


def analyze(
    path: Path | None,
    settings: Settings,
    at: float | None = None,
    *,
    window_s: float | None = None,
    until: float | None = None,
) -> Analysis:
    """One analysis pass over the store (or *path*): the entry point for CLI, sweep and report.

    Without *at*, the windows end at the newest record stamped before *until* (default:
    :func:`until_now`); the nodes stamping records after it are reported (``ahead``).
    """
    cfg = settings.analyze
    span = steps_needed(cfg, window_s)
    if at is not None:
        frame = load(path, settings, since=at - span, until=at)
        return analyze_frame(frame, cfg, at=at, window_s=window_s)
    until = until_now(settings) if until is None else until
    frame, floor = _read_recent(path, settings, span, until, window_s or cfg.window_s)
    if floor is not None:
        found = default_at(frame, window_s or cfg.window_s, until)
        if found is None or found < floor:
            # The windows end before the newest segment begins (most nodes' records stop
            # earlier): records let go as older than needed may be needed after all.
            frame = load_recent(path, settings, span, until)
    return analyze_frame(frame, cfg, window_s=window_s, until=until)


def load_recent(
    path: Path | None, settings: Settings, span: float, until: float | None = None
) -> Frame:
    """Read only the newest segments' files that can hold the last *span* seconds (the newest
    before *until*: a segment's file of a clock ahead does not count; it is read, though, so
    that the analysis can name its nodes). Closed segments count whether their JSON Lines
    are there or not: a store idle for longer than the raw retention is analysed from the
    Parquet files of its last segments."""
    return _read_recent(path, settings, span, until)[0]


def _read_recent(
    path: Path | None,
    settings: Settings,
    span: float,
    until: float | None,
    window_s: float | None = None,
) -> tuple[Frame, float | None]:
    """What :func:`load_recent` reads; with *window_s*, less the records older than a pass
    needs, let go as they are read (:func:`needed_from`): of the hour of segments read for
    the steps and the clocks apart, the other kinds' windows need a quarter of an hour. The
    newest segment is read first, whole: while most nodes write, the windows end where its
    nodes' records do, and the older segments are read for a pass ending there. Also
    returns that end (None: nothing let go); a pass whose windows end earlier must read
    again what was let go."""
    root = path if path is not None else settings.store.root
    wanted: list[str] | None = None

    def pick(names: Collection[str]) -> list[str] | None:
        nonlocal wanted
        wanted = segments.recent(names, span, until)
        return wanted

    # only the wanted segments' files are handed on: older ones are never even stat'ed (nor
    # listed, where a segment's directory holds them)
    groups = segment_groups(root, closed_segments=settings.analyze.cache, pick=pick)
    if wanted is None:
        return load(path, settings, groups=groups), None
    since = segments.earliest_start(wanted)
    # (a segment of no file: a directory made as nothing was written, or a closed segment
    # whose files retention removed, which a store nobody wrote to for a day may hold)
    newest = segments.newest([name for name in wanted if groups.get(name)], until)
    if window_s is None or newest is None:
        return load(path, settings, since=since, groups=groups), None
    last = {name for name in wanted if (segments.span(name) or (-math.inf,))[0] >= newest[0]}
    first = load(path, settings, since=since, groups={name: groups[name] for name in last})
    end = max(default_at(first, window_s, until) or newest[0], newest[0])
    keep = needed_from(end, settings.analyze, window_s)
    older = {name: files for name, files in groups.items() if name not in last}
    first = cut(first, keep)
    return load(path, settings, since=since, groups=older, keep_from=keep, read_before=[first]), end


def bad_summary(bad: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(bad.items())) or "none"
