"""Optional Slurm backend over pyslurm (talks to slurmctld through libslurm, no processes).

pyslurm is only published for recent Slurm releases (25.11), so this backend is
for sites that run a matching Slurm. It has not been run against a controller: no
release that pyslurm 25.11 supports was in reach. The CLI backend is the default and
the one tested against real 22.05, 24.11 and 26.05 controllers. It maps pyslurm's objects onto the
same typed view (:mod:`guardctl.slurm.types`) and the same errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from guardctl.errors import ConfigError, SlurmError, SlurmUnavailable
from guardctl.nodes import fold
from guardctl.sections.slurm import SlurmSettings
from guardctl.slurm import parse
from guardctl.slurm.job import signal_name
from guardctl.slurm.types import JobInfo, NodeInfo, ReservationInfo, SubmitRequest
from guardctl.topology import Topology

T = TypeVar("T")
_FLAG_NAMES = {
    "MAINT": "MAINTENANCE",
    "IGNORE_JOBS": "IGNORE_RUNNING_JOBS",
    "OVERLAP": "OVERLAP",
    "SPEC_NODES": "SPECIFIC_NODES",
}


class PyslurmClient:
    """A :class:`guardctl.slurm.types.SlurmClient` over pyslurm's object API."""

    def __init__(self, settings: SlurmSettings) -> None:
        if settings.conf:
            os.environ["SLURM_CONF"] = settings.conf  # libslurm reads it at first use
        try:
            import pyslurm
        except ImportError as exc:
            raise ConfigError(
                f"slurm.backend: 'pyslurm' is not importable ({exc}); install guardctl[pyslurm] "
                "matching your Slurm, or use backend = 'cli'"
            ) from None
        self.pyslurm: Any = pyslurm
        self.settings = settings

    def _call(self, what: str, func: Callable[[], T]) -> T:
        try:
            return func()
        except self.pyslurm.RPCError as exc:
            text = str(exc)
            if "contact" in text.lower() or "connection" in text.lower():
                raise SlurmUnavailable(f"{what}: {text}") from None
            raise SlurmError(f"{what}: {text}") from None

    def nodes(self) -> list[NodeInfo]:
        loaded = self._call("load nodes", self.pyslurm.Nodes.load)
        out = []
        for node in loaded.values():
            base, flags = parse.split_state(str(node.state or ""))
            out.append(
                NodeInfo(
                    name=node.name,
                    state=base,
                    flags=flags,
                    reason=node.reason or "",
                    reason_user=node.reason_user or "",
                    reason_time=node.reason_time or None,
                    partitions=tuple(node.partitions or ()),
                    cpus=int(node.total_cpus or 0),
                    gres=",".join(node.configured_gres or ()) if node.configured_gres else "",
                )
            )
        return out

    def jobs(self) -> list[JobInfo]:
        loaded = self._call("load jobs", self.pyslurm.Jobs.load)
        return [_job(job) for job in loaded.values()]

    def recent_jobs(self) -> list[JobInfo]:
        # libslurm's job list holds every job the controller has, ended ones included.
        return self.jobs()

    def reservations(self) -> list[ReservationInfo]:
        loaded = self._call("load reservations", self.pyslurm.Reservations.load)
        return [_reservation(r) for r in loaded.values()]

    def topology(self) -> Topology | None:
        # pyslurm has no topology API: read it as the CLI backend does (scontrol).
        from guardctl.slurm.cli_backend import CliSlurm

        return CliSlurm(self.settings).topology()

    def _modify_nodes(self, nodes: Sequence[str], **changes: str) -> None:
        change = self.pyslurm.Node(**changes)
        target = self.pyslurm.Nodes.load()
        selected = {n: target[n] for n in nodes if n in target}
        if len(selected) != len(nodes):
            raise SlurmError(f"unknown node(s) in {fold(nodes)}")
        self._call("modify nodes", lambda: self.pyslurm.Nodes(selected).modify(change))

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        if not reason.strip():
            raise SlurmError("a drain needs a reason")
        self._modify_nodes(nodes, state="DRAIN", reason=reason)

    def resume(self, nodes: Sequence[str]) -> None:
        self._modify_nodes(nodes, state="RESUME")

    def create_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        users: Sequence[str],
        flags: Sequence[str] = ("MAINT", "IGNORE_JOBS"),
    ) -> None:
        flag_enum = self.pyslurm.ReservationFlags
        value = flag_enum(0)
        for flag in flags:
            value |= getattr(flag_enum, _FLAG_NAMES.get(flag, flag))
        resv = self.pyslurm.Reservation(
            name=name, nodes=fold(nodes), users=list(users), flags=value, duration="365-00:00:00"
        )
        self._call("create reservation", resv.create)

    def delete_reservation(self, name: str) -> None:
        self._call("delete reservation", self.pyslurm.Reservation(name).delete)

    def submit(self, request: SubmitRequest) -> int:
        desc = self.pyslurm.JobSubmitDescription(
            name=request.job_name,
            script=request.script,
            script_args=" ".join(request.args) or None,
            required_nodes=fold(request.nodes) if request.nodes else None,
            nodes=len(request.nodes) or request.node_count or None,
            reservations=request.reservation or None,
            partition=request.partition or None,
            time_limit=str(request.time_limit_min) if request.time_limit_min else None,
            standard_output=request.output or None,
            ntasks_per_node=request.ntasks_per_node,
            environment={**os.environ, **request.env},
        )
        return int(self._call("submit", desc.submit))

    def cancel(self, job_id: int) -> None:
        self._call("cancel", lambda: self.pyslurm.Job(int(job_id)).cancel())

    def job(self, job_id: int) -> JobInfo | None:
        try:
            loaded = self.pyslurm.Job.load(int(job_id))
        except self.pyslurm.RPCError as exc:
            if "invalid job id" in str(exc).lower():
                return None  # Slurm has forgotten it
            raise SlurmError(f"load job {job_id}: {exc}") from None
        return _job(loaded)

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._call("requeue", lambda: self.pyslurm.Job(int(job_id)).requeue(hold=hold))

    def release_hold(self, job_id: int) -> None:
        self._call("release", lambda: self.pyslurm.Job(int(job_id)).release())

    def update_job(self, job_id: int, *, exclude: Sequence[str]) -> None:
        change = self.pyslurm.JobSubmitDescription(excluded_nodes=fold(exclude) or "")
        self._call("update job", lambda: self.pyslurm.Job(int(job_id)).modify(change))

    def signal(self, job_id: int, signal: str) -> None:
        name = signal_name(signal)
        self._call("signal", lambda: self.pyslurm.Job(int(job_id)).send_signal(name, steps="all"))


def _job(job: Any) -> JobInfo:
    return JobInfo(
        job_id=int(job.id),
        name=job.name or "",
        user=job.user_name or "",
        state=str(job.state or "UNKNOWN").upper(),
        nodes=parse.expand_hostlist(job.allocated_nodes or ""),
        reservation=job.reservation or "",
        partition=job.partition or "",
        exit_code=job.exit_code,
        reason=job.state_reason or "",
        submit_time=job.submit_time,
        start_time=job.start_time,
        end_time=job.end_time,
        excluded=parse.expand_hostlist(getattr(job, "excluded_nodes", None) or ""),
    )


def _reservation(resv: Any) -> ReservationInfo:
    return ReservationInfo(
        name=resv.name,
        nodes=parse.expand_hostlist(resv.nodes or ""),
        users=tuple(resv.users or ()),
        flags=frozenset(str(f).split(".")[-1].upper() for f in (resv.flags or ())),
        start_time=resv.start_time,
        end_time=resv.end_time,
        state="ACTIVE" if resv.is_active else "INACTIVE",
    )
