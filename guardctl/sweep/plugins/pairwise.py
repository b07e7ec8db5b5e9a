"""Sweep ``pairwise``: all-reduce between a suspect and known-good nodes (a weak inter-node link).

Runs ``sweeps/allreduce.sbatch`` on a group of nodes in one job. Which nodes go
together, round after round, is the pairing strategy's choice
(:mod:`guardctl.sweep.pairing`); the group is judged as a whole, slow when any
member or link in it is slow.
"""

from __future__ import annotations

from guardctl.slurm.types import SubmitRequest
from guardctl.sweep.plugins.nccl import allreduce_args, allreduce_env, measurement
from guardctl.sweep.registry import JobSpec, Measurement, Scope, register


class PairwiseSweep:
    """Build, parse: one measurement for the whole group."""

    name = "pairwise"
    scope: Scope = "multi"

    def build(self, job: JobSpec) -> SubmitRequest:
        return allreduce_env(job, job.request("allreduce.sbatch", allreduce_args(job)))

    def parse(self, text: str, nodes: tuple[str, ...]) -> list[Measurement]:
        return measurement(self.name, text, nodes, "group")


register(PairwiseSweep())
