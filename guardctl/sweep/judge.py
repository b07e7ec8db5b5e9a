"""Judging sweep measurements: pass at >= tolerance x reference; the reference is the baseline.

Only a figure below its reference (or a wrong result) fails. A job that measured nothing (it
was cancelled, its node failed, its program or Python was missing, it sat pending until the
timeout, or the program found no backend for the node's GPUs) is *undetermined*: it says
nothing about the node, so the node is neither drained nor released.

Pure functions, tested by handing them values. With no learnt baseline for a
measurement's key, the reference is the median of the same key's figures in the
same run (fleet-relative), and the evidence says so.

``sweep.references`` (per key or key prefix, the most specific wins) can fix a
reference value, set ReFrame-style bounds (``lower``: pass at >= (1 + lower) x
reference instead of ``sweep.tolerance``; ``upper``: fail above (1 + upper) x
reference) and a ``floor``: however far a fleet of slowly degrading nodes pulls
its learnt baseline (or its median) down, the reference never goes below it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from guardctl.sections.sweep import SweepReference
from guardctl.sweep.registry import Measurement

Configured = Mapping[str, SweepReference]


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
    """One measurement judged: pass, fail or undetermined, with the evidence an operator reads."""

    measurement: Measurement
    passed: bool
    reference: Reference | None
    evidence: str
    attempt: int = 1
    undetermined: bool = False  # no figure to judge (the job did not run to a measurement)

    @property
    def failed(self) -> bool:
        """A figure below its reference or a wrong result: what may drain a node."""
        return not self.passed and not self.undetermined

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.measurement.as_dict(),
            "passed": self.passed,
            "evidence": self.evidence,
            "reference": self.reference.as_dict() if self.reference else None,
            "attempt": self.attempt,
            "undetermined": self.undetermined,
        }


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


def configured_for(key: str, configured: Configured | None) -> SweepReference | None:
    """The ``sweep.references`` entry for *key*: the key itself or its longest prefix."""
    if not configured:
        return None
    parts = key.split("|")
    for n in range(len(parts), 0, -1):
        found = configured.get("|".join(parts[:n]))
        if found is not None:
            return found
    return None


def floored(ref: Reference, conf: SweepReference | None) -> Reference:
    if conf is None or not conf.floor or ref.value >= conf.floor:
        return ref
    return Reference(conf.floor, "floor", f"{ref.source} {fmt(ref.value)} is below it")


def references(
    measurements: Iterable[Measurement],
    baselines: Mapping[str, float],
    configured: Configured | None = None,
) -> dict[str, Reference]:
    """The reference of every key measured: a configured one, else its baseline, else the run's
    median for that key; never below the key's floor."""
    by_key: dict[str, list[Measurement]] = defaultdict(list)
    for m in measurements:
        if not m.error and not m.wrong:
            by_key[m.key].append(m)
    refs = {}
    for key, group in by_key.items():
        conf = configured_for(key, configured)
        if conf is not None and conf.value:
            refs[key] = Reference(conf.value, "reference", "sweep.references")
        elif key in baselines:
            refs[key] = floored(Reference(baselines[key], "baseline"), conf)
        else:
            nodes = {n for m in group for n in m.nodes}
            refs[key] = floored(
                Reference(
                    statistics.median(m.value for m in group),
                    "fleet median",
                    f"no baseline, {len(group)} figure(s) from {len(nodes)} node(s)",
                ),
                conf,
            )
    return refs


def judge(
    m: Measurement,
    reference: Reference | None,
    tolerance: float,
    attempt: int = 1,
    upper: float | None = None,
) -> Judgement:
    """Pass when the figure is correct, at least ``tolerance`` x the reference and, with an
    *upper* bound, at most (1 + upper) x the reference; undetermined when there is no figure."""
    head = f"sweep {subject(m)}"
    if m.wrong:
        return Judgement(m, False, reference, f"{head}: {m.wrong} wrong result(s)", attempt)
    if m.error and not m.value:
        return Judgement(m, False, reference, f"{head}: {m.error}", attempt, undetermined=True)
    if reference is None:
        # Nothing comparable measured (every other figure of this key was wrong or missing).
        return Judgement(m, True, None, f"{head} {fmt(m.value)} {m.metric} (no reference)", attempt)
    if upper is not None and m.value > (1 + upper) * reference.value:
        return Judgement(
            m,
            False,
            reference,
            f"{head} {fmt(m.value)} {m.metric} > "
            f"{1 + upper:g} x {reference.describe()} (above the upper bound)",
            attempt,
        )
    passed = m.value >= tolerance * reference.value
    sign = ">=" if passed else "<"
    evidence = f"{head} {fmt(m.value)} {m.metric} {sign} {tolerance:g} x {reference.describe()}"
    return Judgement(m, passed, reference, evidence, attempt)


def judge_all(
    measurements: Iterable[Measurement],
    refs: Mapping[str, Reference],
    tolerance: float,
    attempt: int = 1,
    configured: Configured | None = None,
) -> list[Judgement]:
    """Judge each figure against its key's reference, with the key's own bounds if it has any."""
    out = []
    for m in measurements:
        conf = configured_for(m.key, configured)
        tol = 1 + conf.lower if conf is not None and conf.lower is not None else tolerance
        out.append(
            judge(m, refs.get(m.key), tol, attempt, conf.upper if conf is not None else None)
        )
    return out
