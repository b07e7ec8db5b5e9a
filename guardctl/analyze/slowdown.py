"""Job-level findings: a job whose steps slowed on every rank alike, against its own history.

Peers cannot see a job slowed equally on every rank (a fleet-wide thermal event, a file-system
stall, a bad library): every rank moves its job's median with it and no node stands out. So
each job is also judged against itself. Its step time in a window is the median of its ranks'
median step times (ranks with ``min_samples`` steps there); its *baseline* is the median of
those over the ``own_history`` windows before the judged ones (at least two of them, so that
one odd window is not a job's normal). A judged window is *slower* when the job's step time
there is ``job_slowdown`` (25%) above its baseline and none of the job's nodes was flagged in
it: a slow node slows its whole job too (every rank waits for it), and that is the node's
matter, which peers already judge. A job slower in ``job_slowdown_windows`` (``persist_k``
when 0) of the last ``persist_n`` windows is ``slowed``, with what it costs; it names no node
at fault, and no node is acted on for it.

A job without a baseline (younger than ``persist_n`` + 2 windows, or read from a source with
no history) or with too few judged windows is ``unknown``, never ``steady``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from guardctl.analyze.features import Features, job_steps

SLOWED, STEADY, UNKNOWN = "slowed", "steady", "unknown"
MIN_BASELINE = 2  # history windows a baseline rests on at least


@dataclass(frozen=True)
class JobPace:
    """One job's step time against its own earlier windows."""

    job: str
    verdict: str  # slowed, steady or unknown
    why: str
    nodes: tuple[str, ...]  # where its ranks ran in the newest window
    ranks: int  # in the newest window
    step_s: float | None = None  # its step time in the newest window it was judged in
    baseline_s: float | None = None  # the median of its history windows'
    windows: int = 0  # judged windows it was slower in
    lost_gpu_h: float = 0.0  # GPU-hours its slower windows lost (a rank per GPU)

    @property
    def ratio(self) -> float | None:
        if self.step_s is None or not self.baseline_s:
            return None
        return self.step_s / self.baseline_s

    @property
    def impact(self) -> dict[str, Any] | None:
        """What the slowdown costs: the job's own ``impact`` shape (pct of each step lost,
        GPU-hours a day at that pace), with its ratio and seconds per step lost."""
        ratio = self.ratio
        if self.verdict != SLOWED or ratio is None or self.step_s is None:
            return None
        assert self.baseline_s is not None
        fraction = 1 - 1 / ratio
        return {
            "job": self.job,
            "pct": round(100 * fraction, 1),
            "gpu_h_per_day": round(fraction * self.ranks * 24.0, 1),
            "gpus": self.ranks,
            "step_s": round(self.step_s, 4),
            "step_s_without": round(self.baseline_s, 4),
            "ratio": round(ratio, 4),
            "s_per_step_lost": round(self.step_s - self.baseline_s, 4),
            "gpu_h_lost": round(self.lost_gpu_h, 2),
        }

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "job": self.job,
            "verdict": self.verdict,
            "why": self.why,
            "nodes": list(self.nodes),
            "ranks": self.ranks,
            "step_s": None if self.step_s is None else round(self.step_s, 4),
            "baseline_s": None if self.baseline_s is None else round(self.baseline_s, 4),
            "ratio": None if ratio is None else round(ratio, 4),
            "windows": self.windows,
            "impact": self.impact,
        }


@dataclass(frozen=True)
class Rule:
    """What makes a job slowed: how much slower than its baseline, in how many windows."""

    slowdown: float  # [analyze] job_slowdown
    windows: int  # of the last persist_n ([analyze] job_slowdown_windows, or persist_k)
    own_history: int  # [analyze] own_history
    min_samples: int


def find(f: Features, hit: np.ndarray, rule: Rule) -> tuple[JobPace, ...]:
    """Every job with step records in the newest window, judged against its own history
    (*hit*: ``(n_windows, n_nodes)`` whether a detector flagged the node in the window).
    Sorted by job name: what a pass numbers its jobs by differs from pass to pass."""
    t = f.rank
    if rule.slowdown <= 0 or not len(t):
        return ()
    n, h = f.n_windows, rule.own_history
    size = len(f.jobs)
    steps = np.full((size, n + h), np.nan)
    ranks = np.zeros((size, n + h), np.int64)
    for table in (job_steps(t, rule.min_samples), f.history_steps):
        if len(table):
            steps[table["job"], table["w"]] = table["step"]
            ranks[table["job"], table["w"]] = table["ranks"]
    # Whether a node of the job was flagged in the window (a count per (job, window) cell).
    cell = t["job"] * n + t["w"]
    flagged = np.bincount(cell, hit[t["w"], t["node"]], minlength=size * n).reshape(size, n) > 0
    # The newest window's rows, split by job once (a scan of the table per job is quadratic).
    rows = np.flatnonzero(t["w"] == 0)
    rows = rows[np.argsort(t["job"][rows], kind="stable")]
    out = []
    for mine in np.split(rows, np.flatnonzero(np.diff(t["job"][rows])) + 1) if rows.size else ():
        job = int(t["job"][mine[0]])
        nodes = tuple(sorted({f.nodes[int(x)] for x in np.unique(t["node"][mine]).tolist()}))
        out.append(
            _judge(f, rule, f.jobs[job], nodes, steps[job], ranks[job], flagged[job], mine.size)
        )
    out.sort(key=lambda p: p.job)
    return tuple(out)


def _judge(
    f: Features,
    rule: Rule,
    job: str,
    nodes: tuple[str, ...],
    steps: np.ndarray,
    ranks: np.ndarray,
    flagged: np.ndarray,
    count: int,
) -> JobPace:
    """One job's pace (*steps*: its step time per window, judged ones first, NaN: none)."""
    n = f.n_windows
    base = steps[n:][np.isfinite(steps[n:])]
    if base.size < MIN_BASELINE:
        return JobPace(
            job,
            UNKNOWN,
            f"too short to judge against its own history: {base.size} of the "
            f"{rule.own_history} windows before the last {n} hold its steps, a baseline "
            f"needs {MIN_BASELINE} (analyze.own_history)",
            nodes,
            count,
        )
    baseline = float(np.median(base))
    if not baseline > 0:  # steps recorded without their time: nothing to compare
        return JobPace(job, UNKNOWN, "its earlier steps record no step time", nodes, count)
    judged = np.isfinite(steps[:n])
    if int(judged.sum()) < rule.windows:
        return JobPace(
            job,
            UNKNOWN,
            f"steps in {int(judged.sum())} of the last {n} windows, a verdict needs {rule.windows}",
            nodes,
            count,
            baseline_s=baseline,
        )
    above = judged & (steps[:n] >= baseline * (1 + rule.slowdown))
    slower = above & ~flagged
    newest = int(np.flatnonzero(judged)[0])
    held = np.flatnonzero(slower)
    shown = int(held[0]) if held.size else newest  # the newest slower window, else the newest
    step = float(steps[shown])
    pace = JobPace(job, STEADY, "", nodes, count, step, baseline, int(slower.sum()))
    if held.size >= rule.windows:
        lost = float(np.sum(ranks[held] * f.window_s * (1 - baseline / steps[held]))) / 3600
        why = (
            f"job {job}'s steps take {step / baseline:.2f}x its own earlier pace ({step:.4g} s "
            f"against {baseline:.4g} s) in {held.size} of the last {n} windows, with no node "
            "of it flagged: a cause the whole job shares (the file system, its input, a "
            "library, the fleet), not a node fault"
        )
        return replace(pace, verdict=SLOWED, why=why, lost_gpu_h=lost)
    node_matter = "where a node of it was flagged: that node's matter, not the job's"
    if held.size:
        why = (
            f"slower than its own earlier pace in {held.size} of {n} windows (needs {rule.windows})"
        )
    elif (above & flagged).any():
        why = f"slower than its own earlier pace ({baseline:.4g} s) only {node_matter}"
    else:
        why = f"within {rule.slowdown:.0%} of its own earlier pace ({baseline:.4g} s)"
    if held.size and (above & flagged).any():
        why += f"; slower also {node_matter}"
    return replace(pace, why=why)
