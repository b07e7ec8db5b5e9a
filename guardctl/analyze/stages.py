"""Job-level findings: a pipeline stage that is slower on every replica.

The analyzer compares a rank only with the ranks of its own pipeline stage, so a stage that
holds more layers (the last one, with the loss head, most often) is never blamed on its nodes.
It is still worth saying: the whole job waits for that stage, and the fix is the job's layer
split, not a node (ByteDance, arXiv 2505.05713: most stragglers in large jobs are not a bad
machine). A stage is reported when, in at least ``persist_k`` of the last ``persist_n`` windows,
even its fastest rank's median compute time is ``stage_imbalance`` above the median of the
other stages' medians, on at least two data-parallel replicas (distinct ``dp_rank`` where
the records name it, else two or more ranks): "on every replica", so that one slow rank (a
node fault, which its stage peers show) cannot pass for a heavy stage, nor can one replica's
tensor-parallel group, whose ranks all wait for their slowest inside every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from guardctl.analyze.features import Features


@dataclass(frozen=True)
class StageImbalance:
    """One job's pipeline stage that is heavier than the others on every replica."""

    job: str
    stage: int
    nodes: tuple[str, ...]
    ratio: float  # its fastest rank's compute time over the other stages' (newest window held)
    windows: int  # how many of the windows it held in

    @property
    def why(self) -> str:
        return (
            f"pipeline stage {self.stage} of job {self.job} computes {self.ratio:.2f}x the "
            f"other stages on every replica in {self.windows} windows: the job's layer "
            "split, not a node fault"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "stage": self.stage,
            "nodes": list(self.nodes),
            "ratio": round(self.ratio, 4),
            "windows": self.windows,
            "why": self.why,
        }


def find(f: Features, imbalance: float, persist_k: int) -> tuple[StageImbalance, ...]:
    """The heavy stages of every job with step records that name their stage."""
    t = f.rank
    if not len(t) or imbalance <= 0:
        return ()
    # Only the rows that name their stage, split by job once: a pass runs this every time.
    known = np.flatnonzero(t["stage"] >= 0)
    known = known[np.argsort(t["job"][known], kind="stable")]
    jobs = t["job"][known]
    out = []
    for rows in np.split(known, np.flatnonzero(np.diff(jobs)) + 1) if known.size else ():
        windows = t["w"][rows]
        held: dict[int, list[tuple[int, float]]] = {}  # stage -> (window, ratio)
        for w in range(f.n_windows):
            heavy = _heaviest(t, rows[windows == w], imbalance)
            if heavy is not None:
                held.setdefault(heavy[0], []).append((w, heavy[1]))
        for stage, hits in sorted(held.items()):
            if len(hits) < persist_k:
                continue
            newest, ratio = min(hits)
            mine = rows[(t["stage"][rows] == stage) & (windows == newest)]
            nodes = tuple(sorted({f.nodes[int(n)] for n in t["node"][mine].tolist()}))
            out.append(
                StageImbalance(f.jobs[int(t["job"][rows[0]])], stage, nodes, ratio, len(hits))
            )
    return tuple(out)


def _heaviest(t: Any, rows: np.ndarray, imbalance: float) -> tuple[int, float] | None:
    """(stage, ratio) of the window's heaviest stage when it is *imbalance* above the rest
    (*rows*: the window's indices into the rank table)."""
    stages = t["stage"][rows]
    compute = t["compute_med"][rows]
    names = np.unique(stages)
    if names.size < 2:
        return None
    fastest = np.array([np.min(compute[stages == s]) for s in names])
    top = int(np.argmax(fastest))
    medians = np.array([np.median(compute[stages == s]) for s in names])
    rest = float(np.median(np.delete(medians, top)))
    if rest <= 0 or _replicas(t, rows[stages == names[top]]) < 2:
        return None
    ratio = float(fastest[top]) / rest
    return (int(names[top]), ratio) if ratio >= 1 + imbalance else None


def _replicas(t: Any, rows: np.ndarray) -> int:
    """How many data-parallel replicas *rows* span: their distinct ``dp_rank`` where every
    row names one (the tensor-parallel ranks of one replica wait for each other inside each
    layer, so one slow GPU slows them all alike), else each rank counts as one."""
    dp = t["dp"][rows]
    return int(np.unique(dp).size) if (dp >= 0).all() else int(rows.size)
