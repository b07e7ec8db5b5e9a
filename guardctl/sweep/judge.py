"""Judging sweep measurements: pass at >= tolerance x reference; the reference is the baseline.

Pure functions, tested by handing them values. With no learnt baseline for a
measurement's key, the reference is the median of the same key's figures in the
same run (fleet-relative), and the evidence says so.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from guardctl.sweep.registry import Measurement


@dataclass(frozen=True)
class Reference:
    """What a figure is compared with, and where that number came from."""

    value: float
    source: str  # "baseline", "fleet median", "known-good group"
    note: str = ""  # e.g. "no baseline, 3 nodes"

    def describe(self) -> str:
        text = f"{self.source} {fmt(self.value)}"
        return f"{text} ({self.note})" if self.note else text

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "note": self.note}


@dataclass(frozen=True)
class Judgement:
    """One measurement judged: pass or fail, with the evidence an operator reads."""

    measurement: Measurement
    passed: bool
    reference: Reference | None
    evidence: str
    attempt: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.measurement.as_dict(), "passed": self.passed, "evidence": self.evidence,
            "reference": self.reference.as_dict() if self.reference else None,
            "attempt": self.attempt,
        }  # fmt: skip


def fmt(value: float) -> str:
    """Three significant digits: 612, 0.0893, 1.23e+03 never (TFLOP/s and GB/s stay small)."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def subject(m: Measurement) -> str:
    """The measured thing as a drain reason names it: ``gemm gpu3``, ``pairwise node3+node1``."""
    if m.unit == "group":
        return f"{m.sweep} {'+'.join(m.nodes)}"
    if m.unit == "node":
        return f"{m.sweep} {m.nodes[0]}"
    return f"{m.sweep} {m.unit}"


def references(
    measurements: Iterable[Measurement], baselines: Mapping[str, float]
) -> dict[str, Reference]:
    """The reference of every key measured: its baseline, else the run's median for that key."""
    by_key: dict[str, list[Measurement]] = defaultdict(list)
    for m in measurements:
        if not m.error and not m.wrong:
            by_key[m.key].append(m)
    refs = {}
    for key, group in by_key.items():
        if key in baselines:
            refs[key] = Reference(baselines[key], "baseline")
        else:
            nodes = {n for m in group for n in m.nodes}
            refs[key] = Reference(
                statistics.median(m.value for m in group), "fleet median",
                f"no baseline, {len(group)} figure(s) from {len(nodes)} node(s)",
            )  # fmt: skip
    return refs


def judge(
    m: Measurement, reference: Reference | None, tolerance: float, attempt: int = 1
) -> Judgement:
    """Pass when the figure is correct and at least ``tolerance`` x the reference."""
    head = f"sweep {subject(m)}"
    if m.wrong:
        return Judgement(m, False, reference, f"{head}: {m.wrong} wrong result(s)", attempt)
    if m.error and not m.value:
        return Judgement(m, False, reference, f"{head}: {m.error}", attempt)
    if reference is None:
        # Nothing comparable measured (every other figure of this key was wrong or missing).
        return Judgement(m, True, None, f"{head} {fmt(m.value)} {m.metric} (no reference)",
                         attempt)
    passed = m.value >= tolerance * reference.value
    sign = ">=" if passed else "<"
    evidence = (f"{head} {fmt(m.value)} {m.metric} {sign} {tolerance:g} x "
                f"{reference.describe()}")
    return Judgement(m, passed, reference, evidence, attempt)


def judge_all(
    measurements: Iterable[Measurement],
    refs: Mapping[str, Reference],
    tolerance: float,
    attempt: int = 1,
) -> list[Judgement]:
    return [judge(m, refs.get(m.key), tolerance, attempt) for m in measurements]
