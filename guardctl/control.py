"""The controller: drain, resume, quarantine and release nodes, under guardctl's safety rules.

Rules enforced here, before anything reaches Slurm:

* **Ownership.** guardctl resumes, releases or rewrites only what it took out
  itself: a drain whose reason carries guardctl's prefix *and* matches an entry
  of its own action log, or a quarantine reservation it created and logged. A
  node someone else drained, downed or reserved is left exactly as it is.
* **Caps.** The nodes guardctl holds out at once stay under an absolute number
  and a fraction of the cluster; an action that would cross either is refused
  whole, so nothing partial happens.
* **Rate.** At most ``safety.max_actions_per_hour`` node actions an hour.
* **Crash safety.** Each action is logged as an intent before and an outcome
  after; intents left by a crash are reconciled from Slurm's state first.

Quarantine is a per-node maintenance reservation (Flags=MAINT,IGNORE_JOBS,
Users=<operators>): running jobs finish, production jobs cannot start, sweep
jobs run inside it with ``--reservation``. A DRAIN would block sweeps too.
"""

from __future__ import annotations

import math
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from guardctl.actionlog import ActionLog, Entry, pending_intents
from guardctl.config import Settings
from guardctl.errors import RefusedError, SlurmError, UsageError
from guardctl.slurm import make_client
from guardctl.slurm.types import NodeInfo, ReservationInfo, SlurmClient

Owner = Literal["in service", "quarantined", "drained by guardctl", "held by someone else"]
NODE_ACTIONS = ("drain", "resume", "quarantine", "release")
# An intent from another host younger than this may still be in flight: leave it.
STALE_INTENT_S = 300.0
CRASH_ENV = "GUARDCTL_TEST_CRASH"  # fault injection for the crash-reconciliation tests


@dataclass(frozen=True)
class NodeStatus:
    """One node as an operator wants to see it."""

    name: str
    slurm_state: str
    owner: Owner
    reason: str
    since: float | None
    reservation: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.name, "slurm_state": self.slurm_state, "guardctl": self.owner,
            "reason": self.reason, "since": self.since, "reservation": self.reservation,
        }  # fmt: skip


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


@dataclass
class Snapshot:
    """Slurm's view and guardctl's own record, read once per command."""

    nodes: dict[str, NodeInfo]
    reservations: list[ReservationInfo]
    drained_by_us: dict[str, str] = field(default_factory=dict)  # node -> full reason we set
    quarantined_by_us: dict[str, tuple[str, float]] = field(default_factory=dict)  # -> (resv, ts)

    def reservations_of(self, node: str) -> list[ReservationInfo]:
        # An inactive (future) reservation does not hold the node yet.
        return [r for r in self.reservations if node in r.nodes and r.state != "INACTIVE"]


def _crash_point(name: str) -> None:
    # Lets the tests kill guardctl between two steps of an action, as a crash would.
    if os.environ.get(CRASH_ENV) == name:
        os._exit(99)


class Controller:
    """Drain / resume / quarantine / release with ownership, caps and an action log."""

    def __init__(self, settings: Settings, slurm: SlurmClient | None = None) -> None:
        self.settings = settings
        self.slurm = slurm if slurm is not None else make_client(settings)
        self.log = ActionLog(settings.store.root)
        self.prefix = settings.safety.reason_prefix

    # -- names ---------------------------------------------------------------------------
    def reservation_name(self, node: str) -> str:
        return f"{self.settings.quarantine.reservation_prefix}{node}"

    def full_reason(self, reason: str) -> str:
        text = " ".join(reason.split())
        if not text:
            raise UsageError("a reason is required")
        return text if text.startswith(self.prefix) else f"{self.prefix} {text}"

    # -- reading -------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        snap = Snapshot(
            nodes={n.name: n for n in self.slurm.nodes()},
            reservations=self.slurm.reservations(),
        )
        self._apply_log(snap, self.log.entries())
        return snap

    @staticmethod
    def _apply_log(snap: Snapshot, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if entry.phase not in ("done", "reconciled") or entry.action not in NODE_ACTIONS:
                continue
            for node in entry.nodes:
                if entry.action == "drain":
                    snap.drained_by_us[node] = entry.reason
                elif entry.action == "resume":
                    snap.drained_by_us.pop(node, None)
                elif entry.action == "quarantine":
                    resv = str(entry.evidence.get("reservation", ""))
                    snap.quarantined_by_us[node] = (resv, entry.ts)
                elif entry.action == "release":
                    snap.quarantined_by_us.pop(node, None)

    def owner(self, snap: Snapshot, name: str) -> tuple[Owner, str]:
        """Who holds *name*, and why (the reason an operator should read)."""
        node = snap.nodes[name]
        ours_q = snap.quarantined_by_us.get(name)
        foreign = [r for r in snap.reservations_of(name) if not ours_q or r.name != ours_q[0]]
        if node.drained:
            mine = snap.drained_by_us.get(name)
            if mine is not None and node.reason == mine and node.reason.startswith(self.prefix):
                return "drained by guardctl", node.reason
            return "held by someone else", node.reason or "drained"
        if node.down:
            return "held by someone else", node.reason or f"node is {node.state}"
        if foreign:
            names = ", ".join(r.name for r in foreign)
            return "held by someone else", f"reservation {names}"
        if ours_q and any(r.name == ours_q[0] for r in snap.reservations_of(name)):
            return "quarantined", f"reservation {ours_q[0]}"
        return "in service", ""

    def status(self, names: Sequence[str] | None = None) -> list[NodeStatus]:
        self.reconcile()
        snap = self.snapshot()
        out = []
        for name in self._known(snap, names) if names else sorted(snap.nodes, key=_natural):
            node = snap.nodes[name]
            owner, reason = self.owner(snap, name)
            since = node.reason_time if node.drained else None
            resv = ""
            if owner == "quarantined":
                resv, since = snap.quarantined_by_us[name]
            out.append(NodeStatus(name, node.slurm_state, owner, reason, since, resv))
        return out

    @staticmethod
    def _known(snap: Snapshot, names: Sequence[str]) -> list[str]:
        unknown = [n for n in names if n not in snap.nodes]
        if unknown:
            raise UsageError(f"unknown node(s): {', '.join(unknown)}")
        return list(names)

    # -- safety --------------------------------------------------------------------------
    def _held_out(self, snap: Snapshot) -> set[str]:
        held = set()
        for name in snap.nodes:
            owner, _ = self.owner(snap, name)
            if owner in ("quarantined", "drained by guardctl"):
                held.add(name)
        return held

    def _check_cap(self, snap: Snapshot, adding: Iterable[str]) -> None:
        held = self._held_out(snap)
        after = held | set(adding)
        if len(after) == len(held):
            return
        safety = self.settings.safety
        # The fraction rounds down, but never below one node: a small cluster must still be
        # able to take one bad node out; max_out_nodes=0 forbids holding any.
        by_fraction = max(1, math.floor(safety.max_out_fraction * len(snap.nodes)))
        limit = min(safety.max_out_nodes, by_fraction)
        if len(after) > limit:
            raise RefusedError(
                f"cap: guardctl would hold {len(after)} node(s) out of {len(snap.nodes)} "
                f"(now {len(held)}); the limit is {limit} (safety.max_out_nodes="
                f"{safety.max_out_nodes}, safety.max_out_fraction={safety.max_out_fraction:g}); "
                "nothing was changed"
            )

    def _check_rate(self, count: int) -> None:
        if count == 0:
            return
        hour_ago = time.time() - 3600
        recent = sum(
            len(e.nodes)
            for e in self.log.entries()
            if e.phase == "done" and e.action in NODE_ACTIONS and e.ts >= hour_ago
        )
        limit = self.settings.safety.max_actions_per_hour
        if recent + count > limit:
            raise RefusedError(
                f"rate limit: {recent} node action(s) in the last hour, {count} more would pass "
                f"safety.max_actions_per_hour={limit}; nothing was changed"
            )

    @staticmethod
    def _refuse_foreign(action: str, foreign: dict[str, str]) -> None:
        if foreign:
            detail = "; ".join(f"{n}: {why}" for n, why in foreign.items())
            raise RefusedError(
                f"{action}: not touching node(s) held by someone else ({detail}); "
                "nothing was changed"
            )

    # -- acting --------------------------------------------------------------------------
    def _do(
        self,
        action: str,
        node: str,
        step: Any,
        *,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> None:
        intent = self.log.record(action, "intent", [node], reason=reason, evidence=evidence)
        _crash_point(f"{action}:before-slurm")
        try:
            step()
        except SlurmError as exc:
            self.log.record(
                action,
                "failed",
                [node],
                reason=reason,
                evidence={**(evidence or {}), "error": str(exc)},
                entry_id=intent.id,
            )
            raise
        _crash_point(f"{action}:after-slurm")
        self.log.record(
            action, "done", [node], reason=reason, evidence=evidence, entry_id=intent.id
        )

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
        with self.log.locked():
            self.reconcile()
            snap = self.snapshot()
            todo, results, foreign = [], [], {}
            for name in self._known(snap, names):
                owner, why = self.owner(snap, name)
                if owner == "held by someone else":
                    foreign[name] = why
                elif plan[owner] is None:
                    todo.append(name)
                else:
                    results.append(Action(name, action, "no change", str(plan[owner])))
            self._refuse_foreign(action, foreign)
            if adds_to_cap:
                self._check_cap(snap, todo)
            if dry_run or self.settings.safety.observe_only:
                return results + [Action(n, action, "would do", describe(snap, n)) for n in todo]
            self._check_rate(len(todo))
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
                lambda: self._create(name, resv),
                reason=full,
                evidence={**(evidence or {}), "reservation": resv},
            )
            return f"reservation {resv}"

        plan: dict[Owner, str | None] = {
            "in service": None,
            "quarantined": "already quarantined",
            "drained by guardctl": "already drained by guardctl",
        }
        return self._apply(
            "quarantine", names, dry_run, plan,
            lambda _, n: f"create reservation {self.reservation_name(n)}", perform,
            adds_to_cap=True,
        )  # fmt: skip

    def _create(self, node: str, resv: str) -> None:
        self.slurm.create_reservation(resv, [node], self.settings.quarantine.users)

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
            "drained by guardctl": "drained by guardctl: use resume",
        }
        return self._apply(
            "release", names, dry_run, plan,
            lambda snap, n: f"delete reservation {snap.quarantined_by_us[n][0]}", perform,
            adds_to_cap=False,
        )  # fmt: skip

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

    # -- crash recovery ------------------------------------------------------------------
    def reconcile(self) -> list[Entry]:
        """Close intents left by a crash, from what Slurm shows now; returns what was closed."""
        entries = self.log.entries()
        open_intents = [e for e in pending_intents(entries) if self._abandoned_by_writer(e)]
        if not open_intents:
            return []
        nodes = {n.name: n for n in self.slurm.nodes()}
        reservations = {r.name: r for r in self.slurm.reservations()}
        closed = []
        for intent in open_intents:
            happened = self._took_effect(intent, nodes, reservations)
            phase = "reconciled" if happened else "abandoned"
            closed.append(
                self.log.record(
                    intent.action,
                    phase,
                    intent.nodes,
                    reason=intent.reason,
                    evidence={**intent.evidence, "reconciled_from": "slurm state"},
                    entry_id=intent.id,
                )
            )
        return closed

    @staticmethod
    def _abandoned_by_writer(intent: Entry) -> bool:
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

    @staticmethod
    def _took_effect(
        intent: Entry, nodes: dict[str, NodeInfo], reservations: dict[str, ReservationInfo]
    ) -> bool:
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


def _natural(name: str) -> tuple[Any, ...]:
    # node2 before node10
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
