"""Detector plugins: one file per detector, registered by name into :data:`DETECTORS`.

A detector is a pure function of the feature tables (:mod:`guardctl.analyze.features`)
and its thresholds: it returns :class:`Flags`, one row per window and GPU / port /
node that looks wrong, with the value, the peer reference and the deviation
behind it. Persistence (k of n windows) and verdicts are the engine's job, so a
detector only ever judges one window at a time. Thresholds come from
``[analyze.detectors.<name>]``; each detector lists its keys and defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from guardctl.analyze.features import Features
from guardctl.analyze.groups import peer_stats
from guardctl.errors import ConfigError
from guardctl.plugins import Registry

ABSENT = -1  # no GPU / port / rank for this flag


@dataclass
class Flags:
    """What one detector found: parallel arrays, one entry per flagged row."""

    detector: str
    metric: str
    unit: str
    summary: str  # the operator's words, e.g. "SM clock below peers"
    w: np.ndarray
    node: np.ndarray
    value: np.ndarray
    reference: np.ndarray
    deviation: np.ndarray  # relative to the reference (value / reference - 1), or NaN
    severity: np.ndarray  # >= 1: how far past its thresholds
    gpu: np.ndarray | None = None
    port: np.ndarray | None = None
    rank: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.w.size)

    @classmethod
    def of(
        cls,
        detector: str,
        metric: str,
        unit: str,
        summary: str,
        table: Any,
        hit: np.ndarray,
        value: np.ndarray,
        reference: np.ndarray,
        deviation: np.ndarray,
        severity: np.ndarray,
        **ids: str,
    ) -> Flags:
        """The rows of *table* selected by *hit*; *ids* name its columns, e.g. ``gpu="gpu"``."""
        return cls(
            detector,
            metric,
            unit,
            summary,
            table["w"][hit],
            table["node"][hit],
            value[hit],
            reference[hit],
            deviation[hit],
            severity[hit],
            **{key: table[column][hit] for key, column in ids.items()},
        )


def busy_flags(
    detector: str,
    table: Any,
    hit: np.ndarray,
    value: np.ndarray,
    reference: np.ndarray,
    deviation: np.ndarray,
    severity: np.ndarray,
    against: str,
) -> list[Flags]:
    """A rank's busy time flagged *against* a reference: per step, or per sample where its
    step records count their samples (``per_sample``), under the metric each is measured in."""
    per = table["per_sample"]
    return [
        Flags.of(
            detector,
            metric,
            unit,
            f"rank busy time{each} above {against}",
            table,
            hit & rows,
            value,
            reference,
            deviation,
            severity,
            gpu="local",
            rank="rank",
        )
        for metric, unit, each, rows in (
            ("compute_s", "s", "", ~per),
            ("compute_s_per_sample", "s/sample", " per sample", per),
        )
    ]


def below_peers_under_load(
    detector: str,
    f: Features,
    th: dict[str, float],
    column: str,
    metric: str,
    unit: str,
    summary: str,
) -> list[Flags]:
    """Busy GPUs whose *column* falls below their peers' (same job, same window).

    Idle GPUs are never judged: they clock down and draw little power by design.
    """
    t = f.gpu
    if not len(t):
        return []
    busy = t["util_med"] >= th["busy_util_pct"]
    value = t[column]
    med, mad, _ = peer_stats(t.grouping("peer"), value, busy)
    hit, rdev, sev = deviation_test(value, med, mad, direction=-1, rel=th["rel"], z=th["z"])
    hit &= busy
    return [Flags.of(detector, metric, unit, summary, t, hit, value, med, rdev, sev, gpu="gpu")]


class Detector(Protocol):
    """The plugin interface: a name, default thresholds and a pure ``detect``."""

    name: str
    defaults: dict[str, float]

    def detect(self, f: Features, th: dict[str, float]) -> list[Flags]: ...


DETECTORS: Registry[Detector] = Registry("detector", __name__, unknown=ConfigError)


def register(cls: Callable[[], Detector]) -> Callable[[], Detector]:
    """Class decorator: instantiate the detector and add it to the registry."""
    inst = cls()
    DETECTORS.add(inst.name, inst)
    return cls


def deviation_test(
    value: np.ndarray,
    med: np.ndarray,
    mad: np.ndarray,
    *,
    direction: int,
    rel: float,
    z: float,
    floor_rel: float = 0.01,
    min_abs: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Robust comparison of *value* with its peers' median and MAD.

    A row is flagged when it lies beyond the peers by at least *rel* (relative),
    *min_abs* (absolute) and *z* robust standard deviations, in *direction*
    (+1: high is bad, -1: low is bad). The MAD is floored at *floor_rel* of the
    median so that near-identical peers do not turn noise into a finding.
    Returns (flagged, relative deviation, severity).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.maximum(1.4826 * mad, np.maximum(floor_rel * np.abs(med), 1e-9))
        zs = direction * (value - med) / scale
        rdev = (value - med) / np.abs(med)
        over = direction * (value - med)
        flagged = (zs >= z) & (direction * rdev >= rel) & (over >= min_abs)
        flagged &= np.isfinite(value) & np.isfinite(med)
        sev = np.minimum(zs / z, np.where(rel > 0, direction * rdev / max(rel, 1e-9), np.inf))
    return flagged, np.where(np.isfinite(rdev), rdev, np.nan), np.where(flagged, sev, 0.0)


def load_all() -> dict[str, Detector]:
    """Every detector by name (each module of this package registers its own on import)."""
    return dict(DETECTORS.items())
