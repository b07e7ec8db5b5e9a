"""Crash recovery: close the intents a crashed guardctl left in the action log.

An intent without an outcome means guardctl stopped between logging what it was about to do and
logging that it did it. Whether the step took effect is read from Slurm's state now, and the
intent is closed as ``reconciled`` (it did) or ``abandoned`` (it did not).
"""

from __future__ import annotations

import os
import socket
import time

from guardctl.actionlog import ActionLog, Entry, pending_intents
from guardctl.slurm.types import NodeInfo, ReservationInfo, SlurmClient

# An intent from another host younger than this may still be in flight: leave it.
STALE_INTENT_S = 300.0


def reconcile(log: ActionLog, slurm: SlurmClient) -> list[Entry]:
    """Close intents left by a crash, from what Slurm shows now; returns what was closed."""
    open_intents = [e for e in pending_intents(log.entries()) if abandoned_by_writer(e)]
    if not open_intents:
        return []
    nodes = {n.name: n for n in slurm.nodes()}
    reservations = {r.name: r for r in slurm.reservations()}
    closed = []
    for intent in open_intents:
        phase = "reconciled" if took_effect(intent, nodes, reservations) else "abandoned"
        closed.append(log.record(
            intent.action, phase, intent.nodes, reason=intent.reason,
            evidence={**intent.evidence, "reconciled_from": "slurm state"}, entry_id=intent.id,
        ))  # fmt: skip
    return closed


def abandoned_by_writer(intent: Entry) -> bool:
    """True when the guardctl that wrote *intent* can no longer finish it."""
    if intent.host == socket.gethostname():
        if intent.pid == os.getpid():
            return False
        try:
            os.kill(intent.pid, 0)
            return False  # that guardctl is still running: its action is in flight
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return time.time() - intent.ts > STALE_INTENT_S


def took_effect(
    intent: Entry, nodes: dict[str, NodeInfo], reservations: dict[str, ReservationInfo]
) -> bool:
    """Whether Slurm shows the change *intent* was about to make."""
    node = nodes.get(intent.nodes[0]) if intent.nodes else None
    resv = str(intent.evidence.get("reservation", ""))
    if intent.action == "release":
        return resv not in reservations
    if node is None:
        return False
    if intent.action == "quarantine":
        return resv in reservations and node.name in reservations[resv].nodes
    if intent.action == "drain":
        return node.drained and node.reason == intent.reason
    if intent.action == "resume":
        return not node.drained
    return False
