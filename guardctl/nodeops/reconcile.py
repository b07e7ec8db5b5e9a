"""Crash recovery: close the intents a crashed guardctl left, and delete its leaked sweep holds.

An intent without an outcome means guardctl stopped between logging what it was about to do and
logging that it did it. Whether the step took effect is read from Slurm's state now, and the
intent is closed as ``reconciled`` (it did) or ``abandoned`` (it did not).

A sweep reservation (``guardctl_s_*``, over a group of suspects and known-good partners) lives
only while its sweep runs one multi-node job. When the sweep that made it is dead (its process,
recorded in the reservation's intent as host and pid, is gone), nothing will ever delete it and
its partners would look held forever: the next command cancels what still runs in it and deletes
it, logged like any other node action.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

from guardctl.actionlog import ActionLog, Entry, pending_intents
from guardctl.errors import SlurmError
from guardctl.nodeops.ownership import SWEEP_RESERVE, SWEEP_UNRESERVE, Snapshot
from guardctl.runner import process_alive
from guardctl.slurm.types import NodeInfo, ReservationInfo, SlurmClient

# An intent from another host younger than this may still be in flight: leave it.
STALE_INTENT_S = 300.0


def reconcile(log: ActionLog, slurm: SlurmClient, *, sweep_max_age_s: float = 3600.0,
              settle_s: float = 15.0, sleep: Callable[[float], None] = time.sleep) -> list[Entry]:
    """Close intents left by a crash and delete dead sweeps' reservations; returns what it wrote.

    *sweep_max_age_s* bounds how long a live sweep keeps one reservation (a batch's job
    timeout): the liveness of a sweep on another host cannot be asked, only its age.
    """
    entries = log.entries()
    open_intents = [e for e in pending_intents(entries) if abandoned_by_writer(e)]
    leaked = dead_sweep_reservations(entries, sweep_max_age_s)
    if not open_intents and not leaked:
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
    for entry in dead_sweep_reservations(log.entries(), sweep_max_age_s):
        resv = str(entry.evidence.get("reservation", ""))
        if resv in reservations:
            closed += _delete_leaked(log, slurm, entry, settle_s, sleep)
    return closed


def dead_sweep_reservations(entries: Sequence[Entry], max_age_s: float) -> list[Entry]:
    """guardctl's sweep reservations, by their reserve entry, whose sweep is gone."""
    live = Snapshot(nodes={}, reservations=[])
    live.apply_log(entries)
    return [e for e in live.swept_by_us.values() if sweep_is_dead(e, max_age_s)]


def sweep_is_dead(entry: Entry, max_age_s: float) -> bool:
    """Whether the sweep that made the reservation of *entry* can no longer delete it."""
    host = str(entry.evidence.get("host") or entry.host)
    pid = int(entry.evidence.get("pid") or entry.pid)
    if host == socket.gethostname():
        return not process_alive(pid)
    return time.time() - entry.ts > max_age_s + STALE_INTENT_S


def _delete_leaked(log: ActionLog, slurm: SlurmClient, entry: Entry, settle_s: float,
                   sleep: Callable[[float], None]) -> list[Entry]:
    resv = str(entry.evidence["reservation"])
    evidence = {"reservation": resv, "sweep": entry.evidence.get("sweep", ""),
                "because": "its sweep is gone (process "
                           f"{entry.evidence.get('pid') or entry.pid} on "
                           f"{entry.evidence.get('host') or entry.host})"}
    intent = log.record(SWEEP_UNRESERVE, "intent", entry.nodes, evidence=evidence)
    try:
        for job in slurm.jobs():  # the dead sweep's own jobs, in its own reservation
            if job.reservation == resv and not job.finished:
                slurm.cancel(job.job_id)
        _delete_when_free(slurm, resv, settle_s, sleep)
    except SlurmError as exc:
        return [intent, log.record(SWEEP_UNRESERVE, "failed", entry.nodes,
                                   evidence={**evidence, "error": str(exc)}, entry_id=intent.id)]
    return [intent, log.record(SWEEP_UNRESERVE, "done", entry.nodes, evidence=evidence,
                               entry_id=intent.id)]


def _delete_when_free(slurm: SlurmClient, resv: str, settle_s: float,
                      sleep: Callable[[float], None]) -> None:
    # Slurm refuses to delete a reservation while a job in it is still ending.
    deadline = time.monotonic() + settle_s
    while True:
        try:
            slurm.delete_reservation(resv)
            return
        except SlurmError:
            if time.monotonic() >= deadline:
                raise
        sleep(0.5)


def abandoned_by_writer(intent: Entry) -> bool:
    """True when the guardctl that wrote *intent* can no longer finish it."""
    if intent.host == socket.gethostname():
        return not process_alive(intent.pid)
    return time.time() - intent.ts > STALE_INTENT_S


def took_effect(
    intent: Entry, nodes: dict[str, NodeInfo], reservations: dict[str, ReservationInfo]
) -> bool:
    """Whether Slurm shows the change *intent* was about to make."""
    node = nodes.get(intent.nodes[0]) if intent.nodes else None
    resv = str(intent.evidence.get("reservation", ""))
    if intent.action in ("release", SWEEP_UNRESERVE):
        return resv not in reservations
    if intent.action == SWEEP_RESERVE:
        return resv in reservations
    if node is None:
        return False
    if intent.action == "quarantine":
        return resv in reservations and node.name in reservations[resv].nodes
    if intent.action == "drain":
        return node.drained and node.reason == intent.reason
    if intent.action == "resume":
        return not node.drained
    return False
