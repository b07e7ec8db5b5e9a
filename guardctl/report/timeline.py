"""A fleet's history over a period: the analyzer run at regular points, as a timer would have.

The period is read an hour at a time (plus the history a pass needs), sorted by
time, and each pass sees only its own windows (a slice, no copy): a day of
passes costs about as much as reading the day, in the memory of one hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from guardctl.analyze import SUSPECT, UNKNOWN, WATCH, Analysis, analyze_frame
from guardctl.analyze.engine import default_at
from guardctl.analyze.frame import Frame, slice_sorted, sort_by_time
from guardctl.storage.source import Source

CHUNK_S = 3600.0  # telemetry read per step of a long report
VERDICT_CODE = {"healthy": 0, UNKNOWN: 1, SUSPECT: 2, WATCH: 3}


@dataclass
class Timeline:
    """Per pass and node: verdict code and score; plus the newest pass in full."""

    times: np.ndarray  # (P,) end of each pass's newest window
    nodes: list[str]
    verdicts: np.ndarray  # (P, N) VERDICT_CODE, -1 when the node was not seen
    scores: np.ndarray  # (P, N)
    latest: Analysis
    start: float
    end: float
    files: int = 0
    records: int = 0
    bad: dict[str, int] = field(default_factory=dict)

    def ever_suspect(self) -> list[str]:
        hit = (self.verdicts == VERDICT_CODE[SUSPECT]).any(axis=0)
        return [n for n, h in zip(self.nodes, hit, strict=True) if h]

    def first_suspect(self, node: str) -> float | None:
        col = self.verdicts[:, self.nodes.index(node)] == VERDICT_CODE[SUSPECT]
        return float(self.times[np.argmax(col)]) if col.any() else None


def build_timeline(
    source: Source,
    period_s: float,
    *,
    end: float | None = None,
    step_s: float | None = None,
) -> Timeline:
    """Run the analyzer every *step_s* (default: one window) over the *period_s* before *end*
    (default: the newest data *source* holds)."""
    cfg = source.settings.analyze
    step = step_s or cfg.window_s
    span = source.span()
    if end is None:
        recent = source.recent(span)
        end = default_at(recent, cfg.window_s) if recent.records else None
        if end is None:
            return Timeline(
                np.zeros(0),
                [],
                np.zeros((0, 0), int),
                np.zeros((0, 0)),
                analyze_frame(recent, cfg),
                0.0,
                0.0,
                recent.files,
                0,
                dict(recent.bad),
            )
    start = end - period_s
    times = np.arange(end, start, -step)[::-1]
    acc = _Accumulator(times.size)
    latest = None
    # An hour at a time: memory stays that of one hour (plus the history a pass needs),
    # whatever the period.
    for lo in np.arange(start, end, CHUNK_S):
        hi = min(lo + CHUNK_S, end)
        chunk = times[(times > lo) & (times <= hi)] if lo > start else times[times <= hi]
        if not chunk.size:
            continue
        since, until = float(chunk[0]) - span, float(chunk[-1])
        frame = sort_by_time(source.load(since, until))
        acc.read(frame, lo, hi)
        for t in chunk:
            latest = analyze_frame(slice_sorted(frame, t - span, t), cfg, at=float(t))
            acc.add(int(np.searchsorted(times, t)), latest)
    assert latest is not None
    nodes, verdicts, scores = acc.arrays()
    return Timeline(
        times, nodes, verdicts, scores, latest, start, end, acc.files, acc.records, acc.bad
    )


class _Accumulator:
    """Verdicts and scores per pass, collected without keeping every pass's full result."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.index: dict[str, int] = {}
        self.cells: list[tuple[int, int, int, float]] = []
        self.files = 0
        self.records = 0
        self.bad: dict[str, int] = {}

    def read(self, frame: Frame, lo: float, hi: float) -> None:
        self.files = max(self.files, frame.files)
        for cols in frame.cols.values():
            lo_i, hi_i = np.searchsorted(cols["ts"], [lo, hi], side="right")
            self.records += int(hi_i - lo_i)
        for reason, count in frame.bad.items():  # per-hour totals: overlapping chunks
            self.bad[reason] = max(self.bad.get(reason, 0), count)

    def add(self, i: int, result: Analysis) -> None:
        for v in result.nodes:
            col = self.index.setdefault(v.node, len(self.index))
            self.cells.append((i, col, VERDICT_CODE[v.verdict], v.score))

    def arrays(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        order = sorted(self.index, key=self.index.__getitem__)
        by_name = sorted(range(len(order)), key=order.__getitem__)
        remap = np.empty(len(order), int)
        remap[by_name] = np.arange(len(order))
        verdicts = np.full((self.passes, len(order)), -1, int)
        scores = np.zeros((self.passes, len(order)))
        if self.cells:
            cells = np.array(self.cells)
            rows, cols = cells[:, 0].astype(int), remap[cells[:, 1].astype(int)]
            verdicts[rows, cols] = cells[:, 2].astype(int)
            scores[rows, cols] = cells[:, 3]
        return sorted(order), verdicts, scores
