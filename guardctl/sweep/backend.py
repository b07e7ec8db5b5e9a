"""Which program, and which backend in it, a sweep job runs on a node.

A node's GPUs are known from Slurm's Gres (``gpu:8``, ``gpu:h100:8(S:0-1)``); the sweep jobs
are told the count (``GUARDCTL_NODE_GPUS``) and look for GPUs themselves too (the NVIDIA
driver's files). On a node with GPUs the GEMM burn-in needs torch or cupy in the sweep's Python:
without one it reports "no GPU backend" and the sweep is undetermined, never a CPU figure that
passes a GPU node. ``guardctl sweep --dry-run`` shows, per node, what each job would run.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from guardctl import runner
from guardctl.config import Settings

GPU_LIBRARIES = ("torch", "cupy")
NODE_GPUS_ENV = "GUARDCTL_NODE_GPUS"
_GPU_GRES = re.compile(r"^gpu(?::[^:(]+)*:(\d+)(?:\(.*\))?$")
_PROBE = (
    f"import importlib.util as u; print(' '.join(m for m in {GPU_LIBRARIES!r} if u.find_spec(m)))"
)


def gres_gpus(gres: str) -> int:
    """The GPUs a node's Gres string lists (0: none, or no Gres)."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres or ""):
        found = _GPU_GRES.match(item.strip())
        if found:
            total += int(found.group(1))
    return total


def sweep_python(settings: Settings) -> str:
    """The Python the sweep jobs run (``sweep.python``, else this one)."""
    return settings.sweep.python or sys.executable


@dataclass(frozen=True)
class Libraries:
    """The GPU libraries the sweep's Python can import, as seen from this host."""

    python: str
    found: tuple[str, ...] = ()
    problem: str = ""  # why it could not be told (the Python is missing here, say)


def gpu_libraries(python: str, timeout_s: float = 20.0) -> Libraries:
    """Whether *python* has torch or cupy (found without importing them)."""
    try:
        result = runner.run([python, "-c", _PROBE], timeout=timeout_s)
    except runner.CommandError as exc:
        return Libraries(python, (), str(exc))
    return Libraries(python, tuple(result.stdout.split()))


def plan(sweep: str, gpus: int, libs: Libraries) -> tuple[str, str]:
    """(program, backend) a *sweep* job would run on a node with *gpus* GPUs."""
    if sweep == "gemm":
        program = "gemm.sbatch: gemm_burn.py"
        if not gpus:
            return program, "numpy on the CPU (no GPU in the node's Gres)"
        if libs.problem:
            return program, f"GPU ({gpus} in Gres): cannot tell ({libs.problem})"
        if libs.found:
            return program, f"{libs.found[0]} on {gpus} GPU(s)"
        return program, (
            f"none: no GPU backend ({' or '.join(GPU_LIBRARIES)}) in {libs.python} "
            f"for its {gpus} GPU(s): the sweep would be undetermined"
        )
    program = "allreduce.sbatch: all_reduce_perf if on PATH, else allreduce.py"
    if not gpus:
        return program, "torch gloo or a numpy ring on the CPU (no GPU in the node's Gres)"
    if libs.found and "torch" in libs.found:
        return program, f"torch NCCL on {gpus} GPU(s) (or nccl-tests)"
    return program, (
        f"nccl-tests only: no torch in {libs.python} for its {gpus} GPU(s); "
        "without all_reduce_perf the sweep would be undetermined"
    )


def job_gpus(gpus_by_node: dict[str, int], nodes: Sequence[str]) -> int:
    """The GPUs per node a job over *nodes* must find: the fewest any of them has."""
    counts = [gpus_by_node.get(n, 0) for n in nodes]
    return min(counts) if counts else 0
