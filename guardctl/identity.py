"""Who a training process is: its job, rank, world size, local rank and node, from its launcher.

The probe and the data-sharding client both ask this module, so that a rank is
the same rank in its step records and at the data-sharding service.

torchrun's variables come first (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``), then Slurm's (``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID``): under ``srun ... torchrun`` Slurm's task is a whole node's
torchrun, and only torchrun knows the ranks of the processes it started. When
both launchers number the same processes (as many Slurm tasks as ranks) and
they disagree, that is an error, never a silent choice: a ``RANK`` exported
from the batch script into every task would otherwise make every task rank 0.

The job is ``GUARDCTL_JOB`` when set (a local run, or two trainings in one
allocation), else ``SLURM_JOB_ID``; without either there is none (the probe
then writes under job ``local``, and the data-sharding client needs one given).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from guardctl.errors import UsageError

ENV_JOB = "GUARDCTL_JOB"


class IdentityError(UsageError):
    """The launcher's variables are unreadable or contradict each other."""


@dataclass(frozen=True)
class Identity:
    """One training process: job (None outside a job), rank of world, local rank, node."""

    job: str | None
    rank: int
    world: int
    local_rank: int
    node: str
    launcher: str = "none"  # "torchrun", "slurm" or "none": where rank and world came from

    @property
    def worker(self) -> str:
        """The process's name at the data-sharding service: node, rank, pid."""
        return f"{self.node}.r{self.rank}.{os.getpid()}"


def _int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise IdentityError(f"{name}={text!r} is not a whole number") from None
    if value < 0:
        raise IdentityError(f"{name}={value} is negative")
    return value


def _pair(env: Mapping[str, str], rank_var: str, world_var: str) -> tuple[int, int] | None:
    rank, world = _int(env, rank_var), _int(env, world_var)
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        missing, given = (rank_var, world_var) if rank is None else (world_var, rank_var)
        raise IdentityError(f"{given} is set but {missing} is not: set both or neither")
    if world < 1 or rank >= world:
        raise IdentityError(f"{rank_var}={rank} is not a rank of {world_var}={world}")
    return rank, world


def from_env(environ: Mapping[str, str] | None = None) -> Identity:
    """This process's identity from torchrun's and Slurm's variables (see the module's text)."""
    env = os.environ if environ is None else environ
    job = env.get(ENV_JOB) or env.get("SLURM_JOB_ID") or None
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    torchrun = _pair(env, "RANK", "WORLD_SIZE")
    slurm = _pair(env, "SLURM_PROCID", "SLURM_NTASKS")
    if torchrun is not None:
        if slurm is not None:
            _check_agree(torchrun, slurm)
        local = _int(env, "LOCAL_RANK")
        if local is None and slurm is not None and slurm[1] == torchrun[1]:
            local = _int(env, "SLURM_LOCALID")
        return Identity(job, *torchrun, local or 0, node, "torchrun")
    if slurm is not None:
        return Identity(job, *slurm, _int(env, "SLURM_LOCALID") or 0, node, "slurm")
    return Identity(job, 0, 1, _int(env, "LOCAL_RANK") or 0, node)


def _check_agree(torchrun: tuple[int, int], slurm: tuple[int, int]) -> None:
    """torchrun under srun: one Slurm task per torchrun, each starting world/ntasks ranks."""
    (rank, world), (task, tasks) = torchrun, slurm
    if world < tasks:
        raise IdentityError(
            f"WORLD_SIZE={world} but Slurm started SLURM_NTASKS={tasks} tasks: RANK and "
            "WORLD_SIZE look exported from outside this job step (unset them, or use torchrun)"
        )
    if world == tasks and rank != task:
        raise IdentityError(
            f"RANK={rank} but SLURM_PROCID={task} with as many ranks as Slurm tasks "
            f"({world}): one of them is wrong (a RANK exported to every task?)"
        )
