"""The safety rules every node action is checked against before anything reaches Slurm.

A refusal raises :class:`~guardctl.errors.RefusedError` before the first change, so a refused
command leaves Slurm exactly as it was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from guardctl.actionlog import Entry
from guardctl.errors import RefusedError
from guardctl.nodeops.ownership import NODE_ACTIONS, SWEEP_RESERVE, SWEEP_UNRESERVE, Snapshot
from guardctl.sections.safety import SafetySettings


def refuse_foreign(action: str, foreign: dict[str, str]) -> None:
    """Refuse the whole action when any node is held by someone else."""
    if foreign:
        detail = "; ".join(f"{n}: {why}" for n, why in foreign.items())
        raise RefusedError(
            f"{action}: not touching node(s) held by someone else ({detail}); nothing was changed"
        )


def out_limit(safety: SafetySettings, cluster_size: int) -> int:
    """How many nodes guardctl may hold out at once in a cluster of *cluster_size*."""
    # The fraction rounds down, but never below one node: a small cluster must still be
    # able to take one bad node out; max_out_nodes=0 forbids holding any.
    by_fraction = max(1, math.floor(safety.max_out_fraction * cluster_size))
    return min(safety.max_out_nodes, by_fraction)


def check_cap(safety: SafetySettings, snap: Snapshot, prefix: str, adding: Iterable[str]) -> None:
    """Refuse when holding *adding* out as well would pass the cap."""
    held = snap.held_out(prefix)
    after = held | set(adding)
    if len(after) == len(held):
        return
    limit = out_limit(safety, len(snap.nodes))
    if len(after) > limit:
        raise RefusedError(
            f"cap: guardctl would hold {len(after)} node(s) out of {len(snap.nodes)} "
            f"(now {len(held)}); the limit is {limit} (safety.max_out_nodes="
            f"{safety.max_out_nodes}, safety.max_out_fraction={safety.max_out_fraction:g}); "
            "nothing was changed"
        )


def check_partners(
    safety: SafetySettings, snap: Snapshot, prefix: str, adding: Iterable[str]
) -> None:
    """Refuse when borrowing *adding* as sweep partners would pass safety.max_sweep_partners."""
    held = snap.sweep_partners(prefix)
    after = held | set(adding)
    if len(after) > len(held) and len(after) > safety.max_sweep_partners:
        raise RefusedError(
            f"cap: guardctl would hold {len(after)} in-service node(s) as sweep partners "
            f"(now {len(held)}); the limit is safety.max_sweep_partners="
            f"{safety.max_sweep_partners}; nothing was changed"
        )


def check_rate(
    safety: SafetySettings, entries: Iterable[Entry], count: int, now: float | None = None
) -> None:
    """Refuse when *count* more node actions would pass the hourly limit."""
    if count == 0:
        return
    hour_ago = (time.time() if now is None else now) - 3600
    recent = sum(
        weight(e)
        for e in entries
        if e.phase == "done" and e.action in NODE_ACTIONS and e.ts >= hour_ago
    )
    limit = safety.max_actions_per_hour
    if recent + count > limit:
        raise RefusedError(
            f"rate limit: {recent} node action(s) in the last hour, {count} more would pass "
            f"safety.max_actions_per_hour={limit}; nothing was changed"
        )


def weight(entry: Entry) -> int:
    """How many node actions a logged action counts for in the rate limit.

    A sweep reservation counts the nodes it takes out of service (its partners: the suspects
    are quarantined already); giving one back counts nothing, it only returns nodes. Nor does
    the quarantine reservation that a drain deletes (it is part of that drain, which the rate
    check counted as one action per node).
    """
    if entry.action == SWEEP_RESERVE:
        return len(entry.evidence.get("partners") or ())
    if entry.action == SWEEP_UNRESERVE:
        return 0
    if entry.action == "release" and entry.evidence.get("because") == "drained":
        return 0
    return len(entry.nodes)
