"""Drain, resume, quarantine and release nodes (and requeue a job off one), under guardctl's
safety rules.

Rules enforced here, before anything reaches Slurm:

* **Ownership** (:mod:`~guardctl.nodeops.ownership`): guardctl resumes, releases or rewrites
  only what it took out itself. A node someone else drained, downed or reserved is left exactly
  as it is.
* **Caps and rate** (:mod:`~guardctl.nodeops.rules`): the nodes guardctl holds out at once stay
  under an absolute number and a fraction of the cluster, and at most
  ``safety.max_actions_per_hour`` node actions happen an hour; an action that would cross a limit
  is refused whole, so nothing partial happens.
* **Crash safety** (:mod:`~guardctl.nodeops.reconcile`): each action is logged as an intent
  before and an outcome after. Slurm not answering in time (it may have made the change) leaves
  the intent open; a definite refusal is ``failed``. Every acting command first reconciles the
  intents no process is carrying out from Slurm's state, deletes a sweep reservation whose sweep
  died and the quarantine reservation of a node it drained; reading commands and
  ``safety.observe_only`` never do (they change nothing in Slurm), they count what is open.

Quarantine is a per-node maintenance reservation (Flags=MAINT,IGNORE_JOBS,
Users=<operators>): running jobs finish, production jobs cannot start, sweep
jobs run inside it with ``--reservation``. A DRAIN would block sweeps too.
A multi-node sweep job holds its group (suspects and known-good partners) in a
sweep reservation for the length of one job (:meth:`NodeOps.reserve_for_sweep`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from guardctl import testhooks
from guardctl.actionlog import ActionLog, Entry
from guardctl.config import Settings
from guardctl.errors import RefusedError, SlurmError, SlurmUnavailable, UsageError
from guardctl.nodeops import checkpoint, rules
from guardctl.nodeops import reconcile as recovery
from guardctl.nodeops.ownership import (
    REQUEUE,
    SWEEP_RESERVE,
    SWEEP_UNRESERVE,
    NodeStatus,
    Owner,
    Snapshot,
    natural,
)
from guardctl.runner import this_writer
from guardctl.slurm import make_client
from guardctl.slurm.job import Job
from guardctl.slurm.types import SlurmClient

# A log bigger than this is checkpointed by the next acting command (nodeops.checkpoint).
CHECKPOINT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Action:
    """What happened (or, in a dry run, would happen) to one node."""

    node: str
    action: str
    outcome: Literal["done", "would do", "no change"]
    message: str

    def as_dict(self) -> dict[str, str]:
        return {
            "node": self.node,
            "action": self.action,
            "outcome": self.outcome,
            "message": self.message,
        }


class NodeOps:
    """The one door for node actions: ownership, caps, rate limit and an action log."""

    def __init__(
        self,
        settings: Settings,
        slurm: SlurmClient | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """*clock* dates the action log and the rate limit's hour: the wall clock, or the
        clock of the simulated cluster that *slurm* is (``MemorySlurm.time``)."""
        if os.environ.get(testhooks.CRASH_ENV):  # crash points exist for the lab's tests only
            testhooks.require_lab(testhooks.CRASH_ENV, settings.slurm.conf)
        self.settings = settings
        self.slurm = slurm if slurm is not None else make_client(settings)
        self.clock = clock
        self.log = ActionLog(settings.store.root, clock)
        self.prefix = settings.safety.reason_prefix
        self._lock_depth = 0

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's action lock (re-entrant: an action reconciles under it too)."""
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        with self.log.locked():
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0

    # -- names ---------------------------------------------------------------------------
    def reservation_name(self, node: str) -> str:
        return f"{self.settings.quarantine.reservation_prefix}{node}"

    def full_reason(self, reason: str) -> str:
        text = " ".join(reason.split())
        if not text:
            raise UsageError("a reason is required")
        return text if text.startswith(self.prefix) else f"{self.prefix} {text}"

    # -- reading -------------------------------------------------------------------------
    def snapshot(self, entries: Sequence[Entry] | None = None) -> Snapshot:
        """Slurm's nodes and reservations now, beside the log (*entries*: as read already)."""
        snap = Snapshot(
            nodes={n.name: n for n in self.slurm.nodes()},
            reservations=self.slurm.reservations(),
        )
        snap.apply_log(self.log.entries() if entries is None else entries)
        return snap

    def owner(self, snap: Snapshot, name: str) -> tuple[Owner, str]:
        """Who holds *name*, and why (the reason an operator should read)."""
        return snap.owner(name, self.prefix)

    def status(self, names: Sequence[str] | None = None) -> list[NodeStatus]:
        """Each node as Slurm and the log show it now; reading only (nothing is reconciled)."""
        snap = self.snapshot()
        chosen = snap.known(names) if names else sorted(snap.nodes, key=natural)
        return [snap.status(name, self.prefix) for name in chosen]

    # -- acting --------------------------------------------------------------------------
    def _do(
        self,
        action: str,
        node: str | Sequence[str],
        step: Callable[[], Any],
        *,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> None:
        nodes = [node] if isinstance(node, str) else list(node)
        intent = self.log.record(action, "intent", nodes, reason=reason, evidence=evidence)
        testhooks.crash_point(f"{action}:before-slurm")
        recovery.IN_FLIGHT.add(intent.id)
        try:
            step()
        except SlurmUnavailable:
            # slurmctld may have made the change before its answer was lost: the intent stays
            # open, and the next acting command settles it from what Slurm shows.
            raise
        except SlurmError as exc:
            self.log.record(
                action,
                "failed",
                nodes,
                reason=reason,
                evidence={**(evidence or {}), "error": str(exc)},
                entry_id=intent.id,
            )
            raise
        finally:
            recovery.IN_FLIGHT.discard(intent.id)
        testhooks.crash_point(f"{action}:after-slurm")
        self.log.record(action, "done", nodes, reason=reason, evidence=evidence, entry_id=intent.id)

    def _apply(
        self,
        action: str,
        names: Sequence[str],
        dry_run: bool,
        plan: Mapping[Owner, str | None],
        describe: Callable[[Snapshot, str], str],
        perform: Callable[[Snapshot, str], str],
        *,
        adds_to_cap: bool,
    ) -> list[Action]:
        """Decide for every node, check every rule, then act on each node in turn.

        *plan* maps who holds a node to None (act on it) or the message of a no-op; a node
        held by someone else is always refused. Every check runs before the first change,
        so a refusal leaves Slurm exactly as it was.
        """
        observing = dry_run or self.settings.safety.observe_only
        with self.locked():
            if not observing:
                self.reconcile()
            snap = self.snapshot()
            todo, results, foreign = [], [], {}
            for name in snap.known(names):
                owner, why = self.owner(snap, name)
                if owner == "held by someone else":
                    foreign[name] = why
                elif plan[owner] is None:
                    todo.append(name)
                else:
                    results.append(Action(name, action, "no change", str(plan[owner])))
            rules.refuse_foreign(action, foreign)
            if adds_to_cap:
                rules.check_cap(self.settings.safety, snap, self.prefix, todo)
            if observing:
                return results + [Action(n, action, "would do", describe(snap, n)) for n in todo]
            rules.check_rate(self.settings.safety, self.log.entries(), len(todo), self.clock())
            return results + [Action(n, action, "done", perform(snap, n)) for n in todo]

    def quarantine(
        self,
        names: Sequence[str],
        reason: str = "suspect",
        *,
        dry_run: bool = False,
        evidence: dict[str, Any] | None = None,
    ) -> list[Action]:
        """Hold nodes in guardctl's maintenance reservations (out of production, open to sweeps)."""
        full = self.full_reason(reason)

        def perform(snap: Snapshot, name: str) -> str:
            resv = self.reservation_name(name)
            self._do(
                "quarantine",
                name,
                lambda: self.slurm.create_reservation(resv, [name], self.settings.quarantine.users),
                reason=full,
                evidence={**(evidence or {}), "reservation": resv},
            )
            return f"reservation {resv}"

        plan: dict[Owner, str | None] = {
            "in service": None,
            "held for a sweep": None,
            "quarantined": "already quarantined",
            "drained by guardctl": "already drained by guardctl",
        }
        return self._apply(
            "quarantine",
            names,
            dry_run,
            plan,
            lambda _, n: f"create reservation {self.reservation_name(n)}",
            perform,
            adds_to_cap=True,
        )

    def release(
        self,
        names: Sequence[str],
        *,
        dry_run: bool = False,
        evidence: dict[str, Any] | None = None,
    ) -> list[Action]:
        """Delete guardctl's quarantine reservations: the nodes go back to production."""

        def perform(snap: Snapshot, name: str) -> str:
            resv = snap.quarantined_by_us[name][0]
            self._do(
                "release",
                name,
                lambda: self.slurm.delete_reservation(resv),
                evidence={**(evidence or {}), "reservation": resv},
            )
            return f"deleted reservation {resv}"

        plan: dict[Owner, str | None] = {
            "quarantined": None,
            "in service": "not quarantined",
            "held for a sweep": "not quarantined (held for a sweep job)",
            "drained by guardctl": "drained by guardctl: use resume",
        }
        return self._apply(
            "release",
            names,
            dry_run,
            plan,
            lambda snap, n: f"delete reservation {snap.quarantined_by_us[n][0]}",
            perform,
            adds_to_cap=False,
        )

    def drain(
        self,
        names: Sequence[str],
        reason: str,
        *,
        dry_run: bool = False,
        evidence: dict[str, Any] | None = None,
    ) -> list[Action]:
        """Drain nodes with a ``guardctl:`` reason (a quarantined node loses its reservation)."""
        full = self.full_reason(reason)

        def perform(snap: Snapshot, name: str) -> str:
            self._do(
                "drain",
                name,
                lambda: self.slurm.drain([name], full),
                reason=full,
                evidence=evidence,
            )
            if name not in snap.quarantined_by_us:
                return full
            resv = snap.quarantined_by_us[name][0]
            self._do(
                "release",
                name,
                lambda: self.slurm.delete_reservation(resv),
                evidence={"reservation": resv, "because": "drained"},
            )
            return f"{full} (reservation {resv} deleted)"

        plan: dict[Owner, str | None] = {
            "in service": None,
            "quarantined": None,
            "held for a sweep": None,
            "drained by guardctl": "already drained by guardctl",
        }
        return self._apply(
            "drain", names, dry_run, plan, lambda _, n: full, perform, adds_to_cap=True
        )

    def resume(
        self,
        names: Sequence[str],
        *,
        dry_run: bool = False,
        evidence: dict[str, Any] | None = None,
    ) -> list[Action]:
        """Resume nodes that guardctl drained; anything else is left alone."""

        def perform(snap: Snapshot, name: str) -> str:
            self._do(
                "resume",
                name,
                lambda: self._resume_and_wait(name),
                reason=snap.nodes[name].reason,
                evidence=evidence,
            )
            return "back in service"

        plan: dict[Owner, str | None] = {
            "drained by guardctl": None,
            "in service": "in service: nothing to resume",
            "held for a sweep": "in service, held for a sweep job: nothing to resume",
            "quarantined": "quarantined: nothing to resume (use release)",
        }
        return self._apply(
            "resume", names, dry_run, plan, lambda _, n: "resume", perform, adds_to_cap=False
        )

    def _resume_and_wait(self, node: str) -> None:
        self.slurm.resume([node])
        # A resumed node shows idle* for a moment: poll rather than assume.
        deadline = time.monotonic() + self.settings.slurm.settle_timeout_s
        while time.monotonic() < deadline:
            current = {n.name: n for n in self.slurm.nodes()}.get(node)
            if current is not None and not current.drained:
                return
            time.sleep(self.settings.slurm.poll_interval_s)
        raise SlurmError(
            f"{node} still shows as drained {self.settings.slurm.settle_timeout_s:g} s after RESUME"
        )

    def requeue(
        self,
        job: int,
        node: str,
        reason: str,
        *,
        signal: str = "",
        grace_s: float = 0.0,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        """Requeue a running job off *node*, which it may not start on again.

        One action, ``control requeue``: its intent is logged before the first change to the
        job (the *signal*, when one is asked for: a checkpoint request, then *grace_s* to act
        on it), its outcome after the job is released (:meth:`Job.requeue
        <guardctl.slurm.job.Job.requeue>`: requeued held, the node excluded, released). A
        ``failed`` outcome says whether the job may be left held (``held``); the next acting
        command's reconcile releases such a job, and one whose requeue a crash interrupted.
        """
        if self.settings.safety.observe_only:
            raise RefusedError(
                f"requeue of job {job}: safety.observe_only is set; nothing was changed"
            )
        target = Job(self.slurm, job)
        record: dict[str, Any] = {
            **(evidence or {}),
            "job": job,
            "exclude": [node],
            "signal": signal,
        }

        def step() -> None:
            if signal:
                target.signal(signal)
                time.sleep(grace_s)
            try:
                target.requeue(exclude=[node])
            finally:
                record["held"] = target.held  # the outcome line is written from *record*

        self._do(REQUEUE, node, step, reason=reason, evidence=record)

    def record(
        self,
        action: str,
        nodes: Sequence[str],
        *,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> Entry:
        """Log an action that is not a node state change (a sweep submitted, a verdict)."""
        return self.log.record(action, "note", nodes, reason=reason, evidence=evidence)

    def reserve_for_sweep(self, nodes: Sequence[str], sweep_id: str, reservation: str) -> str:
        """Hold *nodes* (suspects and partners) in one sweep reservation for a multi-node job.

        Every node must be quarantined by guardctl (a suspect) or in service and held by no one
        (a partner); the partners count against their own cap (safety.max_sweep_partners)
        and the rate limit. The intent records this process (its writer identity) so that, if
        the sweep dies, the next acting command finds the reservation leaked and deletes it.
        """
        group = list(dict.fromkeys(nodes))
        if self.settings.safety.observe_only:
            raise RefusedError(
                f"sweep reservation {reservation}: safety.observe_only is set; nothing was changed"
            )
        with self.locked():
            self.reconcile()
            snap = self.snapshot()
            owners = {n: self.owner(snap, n) for n in snap.known(group)}
            refused = {
                n: why or owner
                for n, (owner, why) in owners.items()
                if owner not in ("in service", "quarantined")
            }
            if refused:
                detail = "; ".join(f"{n}: {why}" for n, why in refused.items())
                raise RefusedError(
                    f"sweep reservation {reservation}: node(s) not free for a "
                    f"sweep ({detail}); nothing was changed"
                )
            partners = [n for n, (owner, _) in owners.items() if owner == "in service"]
            rules.check_partners(self.settings.safety, snap, self.prefix, partners)
            rules.check_rate(self.settings.safety, self.log.entries(), len(partners), self.clock())
            evidence = {
                "sweep": sweep_id,
                "reservation": reservation,
                "partners": partners,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "writer": this_writer().as_dict(),
            }
            self._do(
                SWEEP_RESERVE,
                group,
                lambda: self.slurm.create_reservation(
                    reservation, group, self.settings.quarantine.users, ("MAINT", "IGNORE_JOBS")
                ),
                evidence=evidence,
            )
        return reservation

    def unreserve(self, reservation: str) -> None:
        """Delete a sweep reservation this sweep made (its group goes back to where it was)."""
        with self.locked():
            snap = self.snapshot()
            entry = snap.swept_by_us.get(reservation)
            if entry is None:
                raise UsageError(f"{reservation} is not a sweep reservation of guardctl's")
            evidence = {"sweep": entry.evidence.get("sweep", ""), "reservation": reservation}
            if not any(r.name == reservation for r in snap.reservations):
                self.log.record(
                    SWEEP_UNRESERVE, "done", entry.nodes, evidence={**evidence, "already": "gone"}
                )
                return
            self._do(
                SWEEP_UNRESERVE,
                entry.nodes,
                lambda: self.slurm.delete_reservation(reservation),
                evidence=evidence,
            )

    def open_intents(self) -> int:
        """How many things the next acting command would reconcile (intents no process carries
        out, dead sweeps' reservations, drained nodes' quarantine reservations, jobs a requeue
        may have left held)."""
        entries = self.log.entries()
        return (
            sum(
                1
                for e in recovery.pending_intents(entries)
                if recovery.abandoned_by_writer(e) and e.action != REQUEUE
            )
            + len(recovery.dead_sweep_reservations(entries, self.settings.sweep.job_timeout_s))
            + len(recovery.left_in_quarantine(entries))
            + len(recovery.unreleased_requeues(entries))
        )

    def reconcile(self) -> list[Entry]:
        """Close intents left open, delete dead sweeps' and drained nodes' reservations, and
        checkpoint a log grown past :data:`CHECKPOINT_BYTES`. For acting commands only: it
        changes Slurm.

        Counting what is open needs no lock; only when there is something to close is the
        store's lock taken, and the log read again under it, so that two commands never close
        one intent twice.
        """
        closed: list[Entry] = []
        if self.open_intents():
            with self.locked():
                closed = recovery.reconcile(
                    self.log,
                    self.slurm,
                    sweep_max_age_s=self.settings.sweep.job_timeout_s,
                    settle_s=self.settings.slurm.settle_timeout_s,
                )
        if self.log.size() > CHECKPOINT_BYTES:
            with self.locked():
                self.log.checkpoint(
                    lambda entries: checkpoint.keep(entries, self.settings, self.clock())
                )
        return closed
