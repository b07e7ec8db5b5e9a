"""The requeue rung's rule: ski rental between running slow and restarting elsewhere.

Running on with a slow node is renting: the job loses its measured slowdown x its GPUs for
every hour it runs (GPU-hours). Requeueing it with the node excluded is buying: the whole job
pays the restart once, half a checkpoint interval of lost work on average, the restart itself
and the wait in the queue. The deterministic ski-rental rule buys once the rent paid so far
reaches the price, which never costs more than twice the best choice made in hindsight; and
it never buys for a job whose remaining time (where Slurm knows its time limit) would cost
less in rent than the restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from guardctl.sections.control import ControlSettings


@dataclass(frozen=True)
class Rental:
    """The numbers behind one requeue decision, in GPU-hours."""

    rent_paid: float  # lost so far: slowdown x GPUs x time since the node was flagged
    price: float  # a restart: GPUs x (checkpoint interval / 2 + restart + queue wait)
    rent_left: float | None  # still to lose if the job runs on to its time limit; None: unknown
    requeue: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {
            "rent_paid_gpu_h": r(self.rent_paid),
            "price_gpu_h": r(self.price),
            "rent_left_gpu_h": r(self.rent_left),
            "requeue": self.requeue,
            "why": self.why,
        }


def restart_cost_s(cfg: ControlSettings, queue_wait_s: float | None = None) -> float:
    """Seconds of the whole job a restart costs (Slurm's own queue-wait estimate if given)."""
    wait = cfg.queue_wait_s if queue_wait_s is None else queue_wait_s
    return cfg.checkpoint_interval_s / 2 + cfg.restart_s + wait


def decide(
    slowdown: float,
    gpus: int,
    slow_for_s: float,
    remaining_s: float | None,
    cfg: ControlSettings,
    queue_wait_s: float | None = None,
) -> Rental:
    """Whether to requeue a job that runs *slowdown* slower on *gpus* GPUs since *slow_for_s*."""
    rate = max(0.0, slowdown) * gpus / 3600.0  # GPU-hours lost per second of running slow
    paid = rate * max(0.0, slow_for_s)
    price = gpus * restart_cost_s(cfg, queue_wait_s) / 3600.0
    left = None if remaining_s is None else rate * max(0.0, remaining_s)
    if rate <= 0:
        return Rental(paid, price, left, False, "no measured slowdown: nothing to win")
    if left is not None and left <= price:
        return Rental(
            paid,
            price,
            left,
            False,
            f"the job's remaining time loses {left:.2f} GPU-h running slow, less than "
            f"a restart's {price:.2f}: let it finish",
        )
    if paid < price:
        return Rental(
            paid,
            price,
            left,
            False,
            f"lost {paid:.2f} GPU-h so far, a restart costs {price:.2f}: keep renting",
        )
    return Rental(
        paid,
        price,
        left,
        True,
        f"lost {paid:.2f} GPU-h so far, at least a restart's {price:.2f}: requeue without the node",
    )
