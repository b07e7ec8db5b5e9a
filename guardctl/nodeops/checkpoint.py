"""What a checkpoint of the action log keeps: the entries that still say something.

The log is append-only and everything guardctl holds, and the controller's ladder, is read back
from it; a log that grows without end is read ever slower. Past a size, the next acting command
replaces it (:meth:`~guardctl.actionlog.ActionLog.checkpoint`) by the entries :func:`keep` picks,
in their order; the whole old file stays under ``actions/archive/``. Kept:

* every entry younger than the horizon: the largest of a week and the controller's
  ``relapse_window_s``, ``flap_window_s`` and ``rebalance_window_s``, ``sweep.job_timeout_s``
  (and so the rate limits' hour);
* older, only what still holds a node or feeds a decision: intents without an outcome, and every
  line of a requeue that may have left its job held (reconcile releases it); per node
  the last ``drain``, ``resume``, ``quarantine`` and ``release`` that took effect; the
  ``sweep reserve`` of every sweep reservation not given back; per node the last ``control
  decision``, ``control rebalance``, ``control fresh start``, ``control sweeping`` and ``control
  sweep``, and its last passed sweep; the ``sweep jobs`` of a sweep still open; the last
  ``control pass``; the last ``control fleet`` of each fleet-wide finding; the last ``control
  fabric`` of each phase (open, cleared, quarantine) of each fabric component.

So what guardctl holds (:meth:`~guardctl.nodeops.ownership.Snapshot.apply_log`) and every
node's ladder (:func:`~guardctl.controller.ladder.derive`) read the same from the checkpoint as
from the whole log, but for what lies before the horizon and no window reaches: the sweeps that
did not pass, and suspect onsets (a node flagged since before the horizon reads as flagged from
the last ``control pass`` before it).
"""

from __future__ import annotations

from collections.abc import Sequence

from guardctl.actionlog import Entry, pending_intents
from guardctl.config import Settings
from guardctl.controller.ladder import FRESH_START, REBALANCE, SWEEPING, derive
from guardctl.nodeops.ownership import SWEEP_RESERVE, Snapshot
from guardctl.nodeops.reconcile import unreleased_requeues

MIN_HORIZON_S = 7 * 86400.0
# The ladder's records of which each node's last one matters.
LAST_PER_NODE = ("control decision", REBALANCE, FRESH_START, SWEEPING, "control sweep")


def horizon_s(settings: Settings) -> float:
    """How far back a checkpoint keeps every entry."""
    c = settings.control
    return max(
        MIN_HORIZON_S,
        c.relapse_window_s,
        c.flap_window_s,
        c.rebalance_window_s,
        settings.sweep.job_timeout_s,
        3600.0,
    )


def keep(entries: Sequence[Entry], settings: Settings, now: float) -> list[Entry]:
    """The entries a checkpoint keeps, oldest first (see the module docstring)."""
    cut = now - horizon_s(settings)
    ids = {id(e) for e in _still_needed(entries)}
    return [e for e in entries if e.ts >= cut or id(e) in ids]


def _still_needed(entries: Sequence[Entry]) -> list[Entry]:
    out: list[Entry] = list(pending_intents(entries))
    held_jobs = {e.id for e in unreleased_requeues(entries)}
    out += [e for e in entries if e.id in held_jobs]
    last: dict[tuple[str, str], Entry] = {}
    fleet: dict[tuple[str, str], Entry] = {}
    passed: dict[str, Entry] = {}
    control_pass = None
    for e in entries:
        if e.phase in ("done", "reconciled") and e.action in (
            "drain",
            "resume",
            "quarantine",
            "release",
        ):
            last.update({(e.action, n): e for n in e.nodes})
        elif e.action in LAST_PER_NODE:
            last.update({(e.action, n): e for n in e.nodes})
            if e.action == "control sweep" and e.evidence.get("verdict") == "pass":
                passed.update({n: e for n in e.nodes})
        elif e.action == "control pass":
            control_pass = e
        elif e.action == "control fleet":
            fleet[(str(e.evidence.get("scope")), str(e.evidence.get("name")))] = e
        elif e.action == "control fabric":  # whether it is open, and what came of it
            fleet[(f"fabric {e.evidence.get('phase')}", str(e.evidence.get("component")))] = e
    out += [*last.values(), *passed.values(), *fleet.values()]
    if control_pass is not None:
        out.append(control_pass)
    held = Snapshot(nodes={}, reservations=[])
    held.apply_log(entries)
    out += [
        e
        for e in entries
        if e.phase in ("done", "reconciled")
        and e.action == SWEEP_RESERVE
        and e.evidence.get("reservation") in held.swept_by_us
    ]
    open_sweeps = {
        str(lad.sweeping.get("sweep")) for lad in derive(entries).values() if lad.sweeping
    }
    open_sweeps |= {str(e.evidence.get("sweep")) for e in held.swept_by_us.values()}
    out += [
        e
        for e in entries
        if e.action == "sweep jobs" and str(e.evidence.get("sweep")) in open_sweeps
    ]
    return out
