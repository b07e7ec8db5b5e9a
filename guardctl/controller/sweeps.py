"""The daemon's sweeps in flight: started by one pass, polled by the passes after it.

A sweep takes minutes (GEMM burn-in, all-reduce, pairwise rounds, the repeat of a failure). The
daemon starts it (:class:`guardctl.sweep.engine.PolledSweep`: the node quarantined, its first
batch of jobs submitted) and goes on watching the fleet; each pass polls it, which submits its
next batch, or judges it and acts once its last batch ended.

Its state is in the action log: ``control sweeping`` when it starts (the sweep id; the entry
names the daemon's host and pid), ``control sweep`` when it is judged or aborted. Its jobs and
its sweep reservations live in the memory of the daemon that started it, so a sweep open in the
log that this process does not hold (its daemon crashed, was restarted, or lost the lease) is
aborted by the leader (:meth:`Sweeps.clean_up`): its unfinished jobs are cancelled (from its
``sweep jobs`` records) and the node, still quarantined, is swept afresh. Its pairwise sweep
reservations name the dead daemon and are deleted by the node-action door's reconcile. A
deposed daemon that is alive touches nothing (its lease fences it): it forgets its sweeps
(:meth:`Sweeps.forget`) and deletes their reservations if it leads again; one that stops while
it leads aborts its own (:meth:`Sweeps.abort_all`). Nothing is leaked: a reservation that could
not be deleted is tried again at every pass. Never two sweeps of one node: one this daemon runs or
one open in the log is refused (:meth:`Sweeps.start`).

A pairwise sweep with partners chosen by the network tree may find that a switch, not the node,
is slow (:mod:`guardctl.sweep.fabric`): its node's verdict is ``fabric`` (never drained) and each
such component becomes a ``control fabric`` record (:func:`record_sweep_fabric`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from guardctl.actionlog import Entry
from guardctl.config import Settings
from guardctl.controller.fabric import open_fabric
from guardctl.controller.ladder import BY, FABRIC, SWEEPING, NodeLadder, derive
from guardctl.errors import RefusedError, SlurmError
from guardctl.nodeops import NodeOps
from guardctl.sweep.engine import PolledSweep, SweepOptions, SweepReport

Progress = Callable[[str], None]


@dataclass
class InFlight:
    """One sweep the daemon runs, and what the decision that started it knew."""

    node: str
    sweep: PolledSweep
    duration_s: float
    relapse: int
    lemon: bool
    why: str

    @property
    def sweep_id(self) -> str:
        return self.sweep.report.sweep_id


class Sweeps:
    """The sweeps this daemon started and has not closed."""

    def __init__(self, ops: NodeOps, progress: Progress) -> None:
        self.ops, self.progress = ops, progress
        self.running: dict[str, InFlight] = {}
        self.leftover: list[PolledSweep] = []  # aborted, a reservation not yet deleted

    def start(
        self,
        settings: Settings,
        node: str,
        options: SweepOptions,
        relapse: int,
        lemon: bool,
        why: str,
    ) -> InFlight:
        """Start a sweep of *node* and note it in the action log (its first poll submits).
        Never a second sweep of one node: one this daemon runs, or one open in the log (another
        controller's, until the leader's clean-up closes it), is a RefusedError."""
        self._not_sweeping(node)
        sweep = PolledSweep(settings, [node], options, ops=self.ops, progress=self.progress)
        flight = InFlight(node, sweep, float(options.duration_s or 0.0), relapse, lemon, why)
        self.ops.record(
            SWEEPING,
            [node],
            reason=f"sweep {flight.sweep_id} started: {why}",
            evidence={
                "by": BY,
                "sweep": flight.sweep_id,
                "kind": options.kind,
                "duration_s": flight.duration_s,
                "relapse": relapse,
                "lemon": lemon,
            },
        )
        self.running[node] = flight
        return flight

    def _not_sweeping(self, node: str) -> None:
        running = self.running.get(node)
        if running is not None:
            raise RefusedError(
                f"{node}: sweep {running.sweep_id} of it runs already; not starting another"
            )
        entries = self.ops.log.entries()
        open_one = derive(entries).get(node, NodeLadder(node)).sweeping
        if open_one.get("sweep"):
            raise RefusedError(
                f"{node}: sweep {open_one['sweep']} of it (pid "
                f"{open_one.get('pid')} on {open_one.get('host')}) is open in the "
                "action log; not starting another"
            )

    def poll(self, flight: InFlight) -> SweepReport | None:
        """Its report once judged and acted on, None while its jobs run. An error aborts it
        (the node stays quarantined), closes it in the log and is raised."""
        try:
            report = flight.sweep.poll()
        except Exception as exc:
            self._closed(flight, f"{type(exc).__name__}: {exc}")
            raise
        if report is not None:
            del self.running[flight.node]
        return report

    def abort_all(self, why: str) -> None:
        """Abort every sweep this daemon runs (it stops, or lost the lease)."""
        for flight in list(self.running.values()):
            try:
                flight.sweep.abort(why)
            finally:
                self._closed(flight, why)
        self.retry()

    def forget(self) -> None:
        """Let go of this daemon's sweeps without touching Slurm or the log: the lease is lost,
        and what the sweeps left is the leader's to close (:meth:`clean_up`). Their sweep
        reservations are deleted by this process if it leads again (:meth:`retry`)."""
        for flight in self.running.values():
            if flight.sweep.run.reserved and any(flight.sweep.run.reserved.values()):
                self.leftover.append(flight.sweep)
        self.running.clear()

    def retry(self) -> None:
        """Delete the reservations an abort could not (Slurm was down, say)."""
        self.leftover = [s for s in self.leftover if not s.abort("retry")]

    def _closed(self, flight: InFlight, why: str) -> None:
        self.running.pop(flight.node, None)
        if flight.sweep.run.reserved and any(flight.sweep.run.reserved.values()):
            self.leftover.append(flight.sweep)
        self.ops.record(
            "control sweep",
            [flight.node],
            reason=f"sweep aborted: {why}",
            evidence={
                "verdict": "aborted",
                "action": "kept quarantined",
                "sweep": flight.sweep_id,
                "duration_s": flight.duration_s,
                "relapse": flight.relapse,
                "lemon": flight.lemon,
                "background": True,
            },
        )

    def clean_up(self, ladders: Mapping[str, NodeLadder], entries: Sequence[Entry]) -> list[str]:
        """Abort the open sweeps in the log that this daemon does not run; their nodes."""
        mine = {f.sweep_id for f in self.running.values()}
        out = []
        for node, ladder in sorted(ladders.items()):
            sweep_id = str(ladder.sweeping.get("sweep", ""))
            if not sweep_id or sweep_id in mine:
                continue
            who = f"pid {ladder.sweeping.get('pid')} on {ladder.sweeping.get('host')}"
            self._cancel_jobs(sweep_id, entries)
            why = f"its controller ({who}) no longer runs it; the node stays quarantined"
            self.ops.record(
                "sweep aborted",
                [node],
                reason=why,
                evidence={"sweep": sweep_id, "left": "quarantined"},
            )
            self.ops.record(
                "control sweep",
                [node],
                reason=f"sweep aborted: {why}",
                evidence={
                    "verdict": "aborted",
                    "action": "kept quarantined",
                    "sweep": sweep_id,
                    "background": True,
                },
            )
            out.append(node)
        return out

    def _cancel_jobs(self, sweep_id: str, entries: Sequence[Entry]) -> None:
        jobs = {
            int(j)
            for e in entries
            if e.action == "sweep jobs" and e.evidence.get("sweep") == sweep_id
            for j in dict(e.evidence.get("jobs") or {})
        }
        for job_id in sorted(jobs):
            info = self.ops.slurm.job(job_id)
            if info is not None and not info.finished:
                try:
                    self.ops.slurm.cancel(job_id)
                except SlurmError as exc:  # the others still go; say which one stayed
                    self.progress(f"could not cancel sweep job {job_id}: {exc}")


def record_sweep_fabric(ops: NodeOps, report: SweepReport) -> list[str]:
    """Note each fabric component the sweep found at fault as a ``control fabric`` record
    (phase ``open``, ``source`` sweep), unless it is open already with the same nodes; the
    components noted. Nothing else: a fabric verdict drains no node."""
    opened = open_fabric(ops.log.entries()) if report.fabric else {}
    noted = []
    for finding in report.fabric:
        name = str(finding["component"])
        last = opened.get(name)
        if last is not None and sorted(last.nodes) == sorted(finding["nodes"]):
            continue
        ops.record(
            FABRIC,
            list(finding["nodes"]),
            reason=f"{name} at fault (sweep {report.sweep_id}): "
            + ("; ".join(finding["evidence_for"]) or "-"),
            evidence={
                **finding,
                "phase": "open",
                "source": "sweep",
                "sweep": report.sweep_id,
                "by": BY,
            },
        )
        noted.append(name)
    return noted
