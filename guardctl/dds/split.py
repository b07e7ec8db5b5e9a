"""The per-step split policy: share a fixed global batch among ranks by measured speed.

AntDT's answer to a slow rank in synchronous data parallelism: give each rank
a part of the global batch proportional to its speed, so that all ranks finish
their parts at about the same time, and weight each rank's gradient by its
share so the averaged gradient is still the global batch's mean. These are
pure functions; the service feeds them the speeds it has measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping


def ewma(old: float | None, sample: float, halflife: int) -> float:
    """Blend a new speed *sample* into *old*: *halflife* reports halve an old value's weight."""
    if old is None or old <= 0:
        return sample
    alpha = 1.0 - 0.5 ** (1.0 / halflife)
    return old + alpha * (sample - old)


def rank_speeds(world: int, measured: Mapping[int, float]) -> list[float]:
    """Speeds for ranks ``0..world-1``; a rank not yet measured counts as the median rank."""
    known = [v for r, v in measured.items() if 0 <= r < world and v > 0]
    default = statistics.median(known) if known else 1.0
    return [measured[r] if measured.get(r, 0) > 0 else default for r in range(world)]


def split_batch(global_batch: int, speeds: list[float]) -> list[int]:
    """Shares of *global_batch* proportional to *speeds*; they always sum to *global_batch*.

    Largest-remainder rounding keeps each share within one sample of its exact
    proportional value; ties go to the faster rank, then the lower rank.
    """
    if global_batch < 0:
        raise ValueError("global batch must not be negative")
    if not speeds:
        raise ValueError("no ranks to split among")
    total = sum(speeds)
    if total <= 0:
        speeds = [1.0] * len(speeds)
        total = float(len(speeds))
    exact = [global_batch * v / total for v in speeds]
    shares = [int(x) for x in exact]
    left = global_batch - sum(shares)
    order = sorted(range(len(speeds)), key=lambda r: (-(exact[r] - shares[r]), -speeds[r], r))
    for r in order[:left]:
        shares[r] += 1
    return shares
