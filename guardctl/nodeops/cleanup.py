"""Giving back what guardctl holds in Slurm, for ``guardctl uninstall``.

What guardctl holds is what its action log says it did and Slurm still shows: its quarantine
reservations, its sweep reservations and its drains. Uninstalling releases, unreserves and
resumes them through the node-action door, so ownership, the rate limit and the action log
hold as for any other command; reservations or drains that only look like guardctl's (a
``guardctl`` name or reason that its log does not account for) are listed and left alone.

It is an operator's command, not the controller's: while a controller holds the lease it
would quarantine or drain again behind the operator's back, so uninstalling is refused
(exit 6) until the controller is stopped, unless forced.
"""

from __future__ import annotations

from dataclasses import dataclass

from guardctl.config import Settings
from guardctl.controller.lease import Lease, LeaseUnreadable, who
from guardctl.errors import RefusedError
from guardctl.nodeops.actions import NodeOps
from guardctl.runner import writer_alive


@dataclass(frozen=True)
class Held:
    """One thing guardctl holds (or seems to): what, its name, its nodes, what uninstall does."""

    kind: str  # quarantined | sweep reservation | drained | not in guardctl's log
    name: str  # a node, or a reservation
    nodes: tuple[str, ...]
    detail: str
    result: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "nodes": list(self.nodes),
            "detail": self.detail,
            "result": self.result,
        }


def controller_leading(settings: Settings) -> str:
    """Who holds the controller's lease, in one line; "" when nobody does."""
    lease = Lease(settings.store.root, settings.control.lease_s)
    try:
        holder = lease.read()
    except LeaseUnreadable as exc:
        return f"{exc} (taken as held)"
    if holder is None or holder.released or writer_alive(holder.writer) is False:
        return ""
    return f"{who(holder)} holds the controller lease and has not released it"


def refuse_while_leading(settings: Settings) -> None:
    leading = controller_leading(settings)
    if leading:
        raise RefusedError(
            f"{leading}: stop the controller first (it would act again), or "
            "--force if it is gone; nothing was changed"
        )


def held(ops: NodeOps) -> list[Held]:
    """Everything guardctl holds in Slurm now, and what only looks like its own."""
    snap = ops.snapshot()
    found: list[Held] = []
    for node in sorted(snap.nodes):
        owner, why = ops.owner(snap, node)
        if owner == "quarantined":
            found.append(Held("quarantined", node, (node,), why))
        elif owner == "drained by guardctl":
            found.append(Held("drained", node, (node,), why))
        elif owner == "held by someone else" and why.startswith(ops.prefix):
            found.append(Held("not in guardctl's log", node, (node,), f"drained: {why}"))
    ours = {q[0] for q in snap.quarantined_by_us.values()} | set(snap.swept_by_us)
    prefixes = (ops.settings.quarantine.reservation_prefix, ops.settings.sweep.reservation_prefix)
    for resv in sorted(snap.reservations, key=lambda r: r.name):
        if resv.name in snap.swept_by_us:
            sweep = snap.swept_by_us[resv.name].evidence.get("sweep", "")
            found.append(Held("sweep reservation", resv.name, tuple(resv.nodes), f"sweep {sweep}"))
        elif resv.name not in ours and resv.name.startswith(prefixes):
            found.append(
                Held(
                    "not in guardctl's log",
                    resv.name,
                    tuple(resv.nodes),
                    "reservation named like guardctl's",
                )
            )
    return found


def give_back(ops: NodeOps, *, dry_run: bool) -> list[Held]:
    """Release, unreserve and resume what guardctl holds (*dry_run*: say what would be done)."""
    listed = held(ops)
    quarantined = [h.name for h in listed if h.kind == "quarantined"]
    drained = [h.name for h in listed if h.kind == "drained"]
    actions = [*ops.release(quarantined, dry_run=dry_run), *ops.resume(drained, dry_run=dry_run)]
    results = {a.node: f"{a.outcome}: {a.message}" for a in actions}
    done = []
    for h in listed:
        if h.kind == "sweep reservation":
            if dry_run or ops.settings.safety.observe_only:
                result = f"would do: delete reservation {h.name}"
            else:
                ops.unreserve(h.name)
                result = f"done: deleted reservation {h.name}"
        elif h.kind == "not in guardctl's log":
            result = "left alone: not guardctl's by its log (check by hand)"
        else:
            result = results.get(h.name, "")
        done.append(Held(h.kind, h.name, h.nodes, h.detail, result))
    return done
