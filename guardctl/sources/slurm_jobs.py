"""Which Slurm job ran on which node when: the peer groups of exporter series without a job label.

dcgm-exporter names a GPU's job only where a prolog writes its job-mapping files
(``hpc_job``). Without them, ``source.jobs_from = "slurm"`` asks Slurm itself, through
guardctl's one Slurm client (:meth:`~guardctl.slurm.types.SlurmClient.recent_jobs`,
``squeue --states=all``): each job that ran gives its nodes and its [start, end] (a job
still running has no end yet), and a GPU sample at time t on node n takes the job that
ran on n at t. That covers running jobs and the ones that ended within the controller's
MinJobAge (default 300 s); samples older than what Slurm still holds get no job (the
analyzer's rule for telemetry without one). A node that ran two jobs at once (a shared
node) gives its samples no job: Slurm's job list does not say which GPU served which.

Slurm not answering is an error of the source (:class:`SourceError`, exit code 7), not
an analysis without jobs: peers from the wrong jobs can hide a slow node or flag a
healthy one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from guardctl.errors import SlurmError, SourceError
from guardctl.slurm.types import JobInfo, SlurmClient


@dataclass(frozen=True)
class Run:
    """One job's time on one node."""

    job: str  # Slurm's job id, as SLURM_JOB_ID names it in the probe's step records
    start: float
    end: float  # math.inf while the job runs


@dataclass
class NodeJobs:
    """Per node, the jobs that ran on it and when; and how often a sample found one."""

    runs: dict[str, list[Run]] = field(default_factory=dict)
    jobs: int = 0  # jobs that ran on some node
    attributed: int = 0  # GPU samples given a job
    shared: int = 0  # samples on a node that ran two jobs at once: no job
    unknown: int = 0  # samples with no job on their node at their time (idle, or forgotten)

    @classmethod
    def from_jobs(cls, jobs: Iterable[JobInfo]) -> NodeJobs:
        out = cls()
        for job in jobs:
            if job.start_time is None or not job.nodes:
                continue  # pending, or cancelled before it started: it ran nowhere
            end = job.end_time if job.finished and job.end_time is not None else math.inf
            out.jobs += 1
            for node in job.nodes:
                out.runs.setdefault(node, []).append(Run(str(job.job_id), job.start_time, end))
        return out

    def at(self, node: str, t: float) -> str | None:
        """The job that ran on *node* at *t*, or None (none, or more than one)."""
        found = None
        for run in self.runs.get(node, ()):
            if run.start <= t <= run.end:
                if found is not None and found != run.job:
                    self.shared += 1
                    return None
                found = run.job
        if found is None:
            self.unknown += 1
        else:
            self.attributed += 1
        return found

    def to_dict(self) -> dict[str, object]:
        return {
            "from": "slurm",
            "jobs": self.jobs,
            "samples_with_job": self.attributed,
            "samples_without_job": self.unknown,
            "samples_on_shared_nodes": self.shared,
        }


def read_node_jobs(slurm: SlurmClient) -> NodeJobs:
    """Slurm's jobs as node runs; Slurm failing is the source failing (SourceError)."""
    try:
        jobs = slurm.recent_jobs()
    except SlurmError as exc:
        raise SourceError(
            f'source.jobs_from = "slurm": cannot read Slurm\'s jobs: {" ".join(str(exc).split())}'
        ) from None
    return NodeJobs.from_jobs(jobs)
