"""Crash recovery: close the intents a crashed guardctl left, and delete its leaked holds.

An intent without an outcome means guardctl stopped between logging what it was about to do and
logging that it did it, or Slurm did not answer in time (it may have made the change before its
answer was lost), or the outcome line could not be written. Whether the step took effect is read
from Slurm's state now, and the intent is closed as ``reconciled`` (it did) or ``abandoned`` (it
did not). An intent is left open while its writer may still be carrying it out: this process's
own while its step runs (:data:`IN_FLIGHT`), another live process's on this machine, or, from a
process this one cannot ask (another machine or container), one younger than
:data:`STALE_INTENT_S`. Writers are told apart by :class:`~guardctl.runner.Writer` (machine id,
boot id, pid namespace, pid and start time); entries from before it was recorded fall back to
hostname and pid.

A node guardctl drained after quarantining it must not stay in its quarantine reservation (the
drain deletes it, but that step can fail or time out): the reservation would keep every
production job off the node after its repair. Reconcile deletes it, logged as a ``release``.

A sweep reservation (``guardctl_s_*``, over a group of suspects and known-good partners) lives
only while its sweep runs one multi-node job. When the sweep that made it is dead (its process,
recorded in the reservation's intent as host and pid, is gone), nothing will ever delete it and
its partners would look held forever: the next command cancels what still runs in it and deletes
it, logged like any other node action.

A requeue holds its job for a moment (``scontrol requeuehold``, then the excluded node, then
``scontrol release``). A requeue a crash interrupted, or whose release failed, would leave the
job held (JobHeldAdmin) for ever: reconcile releases a job that guardctl's own log says it held
and did not release, while Slurm still shows it held, and closes the requeue as ``reconciled``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

from guardctl.actionlog import ActionLog, Entry, pending_intents
from guardctl.errors import SlurmError, SlurmUnavailable
from guardctl.nodeops.ownership import REQUEUE, SWEEP_RESERVE, SWEEP_UNRESERVE, Snapshot
from guardctl.runner import Writer, process_alive, this_writer, writer_alive
from guardctl.slurm.types import NodeInfo, ReservationInfo, SlurmClient

# An intent from another host younger than this may still be in flight: leave it.
STALE_INTENT_S = 300.0
# The intents whose Slurm step this process is running now: its only own intents in flight.
IN_FLIGHT: set[str] = set()
# How Slurm shows a job a requeue left held: Slurm 22.05's squeue --json says JobHeldUser even
# for root's requeuehold (scontrol: job_requeued_in_held_state), others JobHeldAdmin. Whose hold
# it is comes from guardctl's own log, never from the reason.
HELD_REASONS = frozenset(
    {"JobHeldAdmin", "JobHeldUser", "job_requeued_in_held_state", "job requeued in held state"}
)
# A requeued job whose old run is still ending: not yet pending, held or not.
REQUEUING = frozenset(
    {"COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "RESIZING"}
)


def reconcile(
    log: ActionLog,
    slurm: SlurmClient,
    *,
    sweep_max_age_s: float = 3600.0,
    settle_s: float = 15.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Entry]:
    """Close intents left by a crash, release jobs guardctl's requeues left held and delete dead
    sweeps' reservations; returns what it wrote.

    *sweep_max_age_s* bounds how long a live sweep keeps one reservation (a batch's job
    timeout): the liveness of a sweep on another host cannot be asked, only its age.
    """
    entries = log.entries()
    open_intents = [
        e for e in pending_intents(entries) if abandoned_by_writer(e) and e.action != REQUEUE
    ]  # release_held's
    leaked = dead_sweep_reservations(entries, sweep_max_age_s)
    held = release_held(log, slurm, entries)
    if not open_intents and not leaked and not left_in_quarantine(entries):
        return held
    nodes = {n.name: n for n in slurm.nodes()}
    reservations = {r.name: r for r in slurm.reservations()}
    closed = held
    for intent in open_intents:
        phase = "reconciled" if took_effect(intent, nodes, reservations) else "abandoned"
        closed.append(
            log.record(
                intent.action,
                phase,
                intent.nodes,
                reason=intent.reason,
                evidence={**intent.evidence, "reconciled_from": "slurm state"},
                entry_id=intent.id,
            )
        )
    entries = log.entries()
    # A sweep reservation whose intent no process carries out: the sweep that asked for it
    # failed or died, and never learnt of it (Slurm made it, the answer was lost).
    orphaned = [e for e in closed if e.action == SWEEP_RESERVE and e.phase == "reconciled"]
    gone = {
        str(e.evidence.get("reservation", "")): e
        for e in [*dead_sweep_reservations(entries, sweep_max_age_s), *orphaned]
    }
    for resv, entry in gone.items():
        if resv in reservations:
            closed += _delete_leaked(log, slurm, entry, settle_s, sleep)
    for node, resv in left_in_quarantine(entries).items():
        closed += _release_drained(log, slurm, node, resv, resv in reservations)
    return closed


def left_in_quarantine(entries: Sequence[Entry]) -> dict[str, str]:
    """node -> its quarantine reservation, for the nodes guardctl drained after quarantining
    them whose reservation the log does not show deleted."""
    snap = Snapshot(nodes={}, reservations=[])
    snap.apply_log(entries)
    return {
        n: snap.quarantined_by_us[n][0]
        for n in sorted(snap.drained_in_quarantine)
        if n in snap.quarantined_by_us
    }


def _release_drained(
    log: ActionLog, slurm: SlurmClient, node: str, resv: str, present: bool
) -> list[Entry]:
    # "because: drained": part of the drain, which the rate limit counted already.
    evidence = {"reservation": resv, "because": "drained", "reconciled_from": "slurm state"}
    if not present:
        return [log.record("release", "done", [node], evidence={**evidence, "already": "gone"})]
    intent = log.record("release", "intent", [node], evidence=evidence)
    try:
        slurm.delete_reservation(resv)
    except SlurmError as exc:  # tried again by the next acting command
        return [
            intent,
            log.record(
                "release",
                "failed",
                [node],
                evidence={**evidence, "error": str(exc)},
                entry_id=intent.id,
            ),
        ]
    return [intent, log.record("release", "done", [node], evidence=evidence, entry_id=intent.id)]


def dead_sweep_reservations(entries: Sequence[Entry], max_age_s: float) -> list[Entry]:
    """guardctl's sweep reservations, by their reserve entry, whose sweep is gone."""
    live = Snapshot(nodes={}, reservations=[])
    live.apply_log(entries)
    return [e for e in live.swept_by_us.values() if sweep_is_dead(e, max_age_s)]


def sweep_is_dead(entry: Entry, max_age_s: float) -> bool:
    """Whether the sweep that made the reservation of *entry* can no longer delete it."""
    # The evidence names the sweep's process: the entry itself may be another's reconcile.
    writer = Writer.from_dict(entry.evidence.get("writer"))
    host = str(entry.evidence.get("host") or entry.host)
    pid = int(entry.evidence.get("pid") or entry.pid)
    alive = writer_alive(writer) if writer.machine else _alive_by_host(host, pid)
    if alive is None:
        return time.time() - entry.ts > max_age_s + STALE_INTENT_S
    return not alive


def _delete_leaked(
    log: ActionLog,
    slurm: SlurmClient,
    entry: Entry,
    settle_s: float,
    sleep: Callable[[float], None],
) -> list[Entry]:
    resv = str(entry.evidence["reservation"])
    evidence = {
        "reservation": resv,
        "sweep": entry.evidence.get("sweep", ""),
        "because": "its sweep is gone or never knew of it (process "
        f"{entry.evidence.get('pid') or entry.pid} on "
        f"{entry.evidence.get('host') or entry.host})",
    }
    intent = log.record(SWEEP_UNRESERVE, "intent", entry.nodes, evidence=evidence)
    try:
        for job in slurm.jobs():  # the dead sweep's own jobs, in its own reservation
            if job.reservation == resv and not job.finished:
                slurm.cancel(job.job_id)
        _delete_when_free(slurm, resv, settle_s, sleep)
    except SlurmError as exc:
        return [
            intent,
            log.record(
                SWEEP_UNRESERVE,
                "failed",
                entry.nodes,
                evidence={**evidence, "error": str(exc)},
                entry_id=intent.id,
            ),
        ]
    return [
        intent,
        log.record(SWEEP_UNRESERVE, "done", entry.nodes, evidence=evidence, entry_id=intent.id),
    ]


def _delete_when_free(
    slurm: SlurmClient, resv: str, settle_s: float, sleep: Callable[[float], None]
) -> None:
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
    if intent.id in IN_FLIGHT:
        return False
    if intent.writer.machine and intent.writer == this_writer():
        return True  # this process's own, and its step is not running: nothing will close it
    alive = (
        writer_alive(intent.writer)
        if intent.writer.machine
        else _alive_by_host(intent.host, intent.pid)
    )
    if alive is None:
        return time.time() - intent.ts > STALE_INTENT_S
    return not alive


def _alive_by_host(host: str, pid: int) -> bool | None:
    """An entry from before writers were recorded: judged by hostname and pid."""
    return process_alive(pid) if host == socket.gethostname() else None


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


def unreleased_requeues(entries: Sequence[Entry]) -> list[Entry]:
    """The requeues that may have left their job held by guardctl, by their last line: an intent
    whose writer can no longer finish it, or a ``failed`` outcome that says the hold may be on
    (``held``; the release failed, or Slurm did not answer the requeue)."""
    last: dict[str, Entry] = {}
    for entry in entries:
        if entry.action == REQUEUE:
            last[entry.id] = entry
    return [
        e
        for e in last.values()
        if (e.phase == "intent" and abandoned_by_writer(e))
        or (e.phase == "failed" and e.evidence.get("held", True))
    ]


def release_held(log: ActionLog, slurm: SlurmClient, entries: Sequence[Entry]) -> list[Entry]:
    """Release the jobs guardctl's requeues held and did not release; returns what it wrote.

    Only a job guardctl's own log says it held (:func:`unreleased_requeues`), and only while
    Slurm shows it pending and held: a job someone else held is never released. A job whose
    old run is still ending is judged at the next pass.
    """
    closed: list[Entry] = []
    for entry in unreleased_requeues(entries):
        closed += _settle_requeue(log, slurm, entry)
    return closed


def _settle_requeue(log: ActionLog, slurm: SlurmClient, entry: Entry) -> list[Entry]:
    job_id = int(entry.evidence.get("job") or 0)
    info = slurm.job(job_id)
    if info is not None and info.state in REQUEUING:
        return []  # on its way to the queue: held or not, Slurm says so at the next pass
    evidence = {k: v for k, v in entry.evidence.items() if k != "error"}
    evidence["reconciled_from"] = "slurm state"
    held = info is not None and info.state == "PENDING" and info.reason in HELD_REASONS
    if held:
        try:
            slurm.release_hold(job_id)
        except SlurmUnavailable:
            raise
        except SlurmError as exc:  # still held: the next pass tries again
            return [
                log.record(
                    REQUEUE,
                    "failed",
                    entry.nodes,
                    reason=entry.reason,
                    evidence={**evidence, "held": True, "error": str(exc)},
                    entry_id=entry.id,
                )
            ]
    found = "gone from Slurm" if info is None else f"{info.state} ({info.reason or 'None'})"
    return [
        log.record(
            REQUEUE,
            "reconciled",
            entry.nodes,
            reason=entry.reason,
            evidence={**evidence, "held": False, "released": held, "found": found},
            entry_id=entry.id,
        )
    ]
