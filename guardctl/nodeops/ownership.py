"""Who holds a node: Slurm's state read beside guardctl's own action log.

guardctl holds a node only when both agree: a drain whose reason carries guardctl's prefix
*and* matches a drain guardctl logged, or a quarantine or sweep reservation it created and
logged. Anything else that keeps a node out (another reason, a DOWN state, another reservation)
is someone else's, and guardctl leaves it exactly as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from guardctl.actionlog import Entry, pending_intents
from guardctl.errors import UsageError
from guardctl.slurm.types import NodeInfo, ReservationInfo

Owner = Literal[
    "in service", "quarantined", "drained by guardctl", "held for a sweep", "held by someone else"
]
# The actions that change who holds a node. A sweep reservation holds a group (suspects and
# their known-good partners) for one multi-node sweep job.
SWEEP_RESERVE, SWEEP_UNRESERVE = "sweep reserve", "sweep unreserve"
NODE_ACTIONS = ("drain", "resume", "quarantine", "release", SWEEP_RESERVE, SWEEP_UNRESERVE)
REQUEUE = "control requeue"  # a job requeued off a node: no node changes hands
# Slurm's states in which a node may still be guardctl's to judge: the base states of a node at
# work, and the flags that say nothing about who holds it (a reservation's RESERVED and
# MAINTENANCE are judged by the reservation itself; PLANNED is the backfill scheduler keeping an
# idle node for a pending job). Every other state or flag (REBOOT_REQUESTED, REBOOT_ISSUED,
# BLOCKED, POWER*, NOT_RESPONDING, INVALID_REG, FUTURE, one a newer release adds) means someone
# or something else has the node: guardctl shows it as Slurm does and leaves it alone.
IN_SERVICE_STATES = frozenset({"idle", "allocated", "mixed", "completing"})
# Of those, the ones that take a node out for repair (not a moment's silence after the Slurm
# controller restarts): a node back from one starts its record with guardctl over.
REPAIR_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
IN_SERVICE_FLAGS = frozenset(
    {
        "RESERVED",
        "MAINTENANCE",
        "PLANNED",
        "COMPLETING",
        "CLOUD",
        "DYNAMIC_NORM",
        "REBOOT_CANCEL",
        "RESUME",
        "UNDRAIN",
    }
)


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
            "node": self.name,
            "slurm_state": self.slurm_state,
            "guardctl": self.owner,
            "reason": self.reason,
            "since": self.since,
            "reservation": self.reservation,
        }


@dataclass
class Snapshot:
    """Slurm's view and guardctl's own record, read once per command."""

    nodes: dict[str, NodeInfo]
    reservations: list[ReservationInfo]
    drained_by_us: dict[str, str] = field(default_factory=dict)  # node -> full reason we set
    quarantined_by_us: dict[str, tuple[str, float]] = field(default_factory=dict)  # -> (resv, ts)
    swept_by_us: dict[str, Entry] = field(default_factory=dict)  # sweep resv -> its reserve entry
    # Nodes guardctl drained while they were in its quarantine reservation, the reservation
    # not logged deleted since (reconcile deletes it).
    drained_in_quarantine: set[str] = field(default_factory=set)
    # Nodes of drain and quarantine intents still open: possibly out already (the cap counts them).
    pending_out: set[str] = field(default_factory=set)
    _by_node: dict[str, list[ReservationInfo]] | None = field(default=None, repr=False)

    def sweep_reservations_of(self, node: str) -> list[str]:
        """guardctl's live sweep reservations that hold *node*."""
        return [r.name for r in self.reservations_of(node) if r.name in self.swept_by_us]

    def reservations_of(self, node: str) -> list[ReservationInfo]:
        # An inactive (future) reservation does not hold the node yet. Indexed once per
        # snapshot: held_out() asks for every node, and fleets have thousands.
        if self._by_node is None:
            self._by_node = {}
            for r in self.reservations:
                if r.state != "INACTIVE":
                    for n in r.nodes:
                        self._by_node.setdefault(n, []).append(r)
        return self._by_node.get(node, [])

    def apply_log(self, entries: Iterable[Entry]) -> None:
        """Fold guardctl's completed node actions into what it holds."""
        entries = list(entries)
        self.pending_out |= {
            n
            for e in pending_intents(entries)
            if e.action in ("drain", "quarantine")
            for n in e.nodes
        }
        for entry in entries:
            if entry.phase not in ("done", "reconciled") or entry.action not in NODE_ACTIONS:
                continue
            for node in entry.nodes:
                if entry.action == "drain":
                    self.drained_by_us[node] = entry.reason
                    if node in self.quarantined_by_us:
                        self.drained_in_quarantine.add(node)
                elif entry.action == "resume":
                    self.drained_by_us.pop(node, None)
                elif entry.action == "quarantine":
                    resv = str(entry.evidence.get("reservation", ""))
                    self.quarantined_by_us[node] = (resv, entry.ts)
                    self.drained_in_quarantine.discard(node)
                elif entry.action == "release":
                    self.quarantined_by_us.pop(node, None)
                    self.drained_in_quarantine.discard(node)
            resv = str(entry.evidence.get("reservation", ""))
            if entry.action == SWEEP_RESERVE:
                self.swept_by_us[resv] = entry
            elif entry.action == SWEEP_UNRESERVE:
                self.swept_by_us.pop(resv, None)

    def known(self, names: Sequence[str]) -> list[str]:
        """*names* as a list; an unknown node is a usage error."""
        unknown = [n for n in names if n not in self.nodes]
        if unknown:
            raise UsageError(f"unknown node(s): {', '.join(unknown)}")
        return list(names)

    def owner(self, name: str, prefix: str) -> tuple[Owner, str]:
        """Who holds *name*, and why (the reason an operator should read)."""
        node = self.nodes[name]
        ours_q = self.quarantined_by_us.get(name)
        foreign = [
            r
            for r in self.reservations_of(name)
            if (not ours_q or r.name != ours_q[0]) and r.name not in self.swept_by_us
        ]
        if node.drained:
            mine = self.drained_by_us.get(name)
            if mine is not None and node.reason == mine and node.reason.startswith(prefix):
                return "drained by guardctl", node.reason
            return "held by someone else", node.reason or "drained"
        if node.down:
            return "held by someone else", node.reason or f"node is {node.state}"
        if node.state not in IN_SERVICE_STATES or node.flags - IN_SERVICE_FLAGS:
            why = f"Slurm state {node.slurm_state}"
            return "held by someone else", f"{why}: {node.reason}" if node.reason else why
        if foreign:
            names = ", ".join(r.name for r in foreign)
            return "held by someone else", f"reservation {names}"
        if ours_q and any(r.name == ours_q[0] for r in self.reservations_of(name)):
            return "quarantined", f"reservation {ours_q[0]}"
        sweeps = self.sweep_reservations_of(name)
        if sweeps:
            sweep = self.swept_by_us[sweeps[0]].evidence.get("sweep", "")
            return "held for a sweep", f"reservation {sweeps[0]} (sweep {sweep})"
        return "in service", ""

    def out_for_repair(self, name: str) -> bool:
        """Whether *name* is drained, down or rebooting: out for repair, whoever holds it."""
        node = self.nodes[name]
        return node.drained or node.down or bool(node.flags & REPAIR_FLAGS)

    def held_out(self, prefix: str) -> set[str]:
        """The nodes guardctl holds out of production now, for the cap: every node in its
        quarantine reservation or with its drain, whoever else holds it too (a node that went
        DOWN or that an administrator drained on top is out all the same), and the nodes of a
        drain or quarantine whose outcome is not known yet."""
        return {n for n in self.nodes if self._in_our_quarantine(n) or self._our_drain(n)} | (
            self.pending_out & set(self.nodes)
        )

    def _in_our_quarantine(self, name: str) -> bool:
        ours = self.quarantined_by_us.get(name)
        return ours is not None and any(r.name == ours[0] for r in self.reservations_of(name))

    def _our_drain(self, name: str) -> bool:
        node, mine = self.nodes[name], self.drained_by_us.get(name)
        return mine is not None and (node.drained or node.down) and node.reason == mine

    def sweep_partners(self, prefix: str) -> set[str]:
        """The nodes guardctl holds now as partners in its sweep reservations (a partner that
        went DOWN or was drained meanwhile still counts); its suspects count in held_out()."""
        held = self.held_out(prefix)
        return {
            n
            for r in self.swept_by_us
            for n in self._resv_nodes(r)
            if n in self.nodes and n not in held
        }

    def _resv_nodes(self, name: str) -> tuple[str, ...]:
        return next((r.nodes for r in self.reservations if r.name == name), ())

    def status(self, name: str, prefix: str) -> NodeStatus:
        node = self.nodes[name]
        owner, reason = self.owner(name, prefix)
        since = node.reason_time if node.drained else None
        resv = ""
        if owner == "quarantined":
            resv, since = self.quarantined_by_us[name]
        elif owner == "held for a sweep":
            resv = self.sweep_reservations_of(name)[0]
            since = self.swept_by_us[resv].ts
        return NodeStatus(name, node.slurm_state, owner, reason, since, resv)


def natural(name: str) -> tuple[Any, ...]:
    """Sort key: node2 before node10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
