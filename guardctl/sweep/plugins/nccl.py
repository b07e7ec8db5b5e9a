"""Sweep ``nccl``: all-reduce bus bandwidth inside one node (NVLink/PCIe paths between its GPUs).

Runs ``sweeps/allreduce.sbatch`` on one node: nccl-tests' ``all_reduce_perf``
when present, else allreduce.py (torch.distributed NCCL/gloo, or a numpy ring
between two tasks on a CPU-only node). Judged on bus bandwidth at large messages.
"""

from __future__ import annotations

import dataclasses

from guardctl.slurm.types import SubmitRequest
from guardctl.sweep import allreduce_output
from guardctl.sweep.registry import JobSpec, Measurement, Scope, register


def allreduce_args(job: JobSpec) -> list[str]:
    """allreduce.py's arguments from the sweep settings (ignored by nccl-tests)."""
    return [
        "--max-bytes",
        str(int(job.options.get("allreduce_max_bytes", 64 << 20))),
        "--iters",
        str(int(job.options.get("allreduce_iters", 5))),
    ]


def allreduce_env(job: JobSpec, request: SubmitRequest) -> SubmitRequest:
    env = dict(request.env)
    if job.options.get("cpu_tasks"):
        env["GUARDCTL_CPU_TASKS"] = str(int(job.options["cpu_tasks"]))
    if job.options.get("nccl_tests") is False:
        env["GUARDCTL_NCCL_TESTS"] = "off"
    return dataclasses.replace(request, env=env)


def measurement(sweep: str, text: str, nodes: tuple[str, ...], unit: str) -> list[Measurement]:
    run = allreduce_output.parse(text)
    if run is None or run.busbw is None:
        return []
    per_node = max(1, run.ranks // max(1, len(nodes)))
    shape = f"{run.ranks} ranks" if len(nodes) == 1 else f"{len(nodes)} nodes x{per_node}"
    return [
        Measurement(
            sweep=sweep,
            nodes=nodes,
            unit=unit,
            metric="GB/s",
            value=round(run.busbw, 6),
            key=f"{sweep}|{run.device or 'unknown device'}|{shape}",
            wrong=run.wrong,
            error="" if run.complete else "output ends early (job killed?)",
            detail=run.detail(),
        )
    ]


class NcclSweep:
    """Build, parse: one measurement for the node."""

    name = "nccl"
    scope: Scope = "single"

    def build(self, job: JobSpec) -> SubmitRequest:
        return allreduce_env(job, job.request("allreduce.sbatch", allreduce_args(job)))

    def parse(self, text: str, nodes: tuple[str, ...]) -> list[Measurement]:
        return measurement(self.name, text, nodes[:1], "node")


register(NcclSweep())
