"""The sweep plugin interface, the measurement a plugin produces, and the registry of plugins."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from guardctl.plugins import Registry
from guardctl.slurm.types import SubmitRequest

Scope = Literal["single", "multi"]


@dataclass(frozen=True)
class Measurement:
    """One judged figure: a GPU's sustained TFLOP/s, a node's or a group's bus bandwidth."""

    sweep: str  # the plugin: gemm, nccl, pairwise
    nodes: tuple[str, ...]  # the node measured, or every node of a multi-node run
    unit: str  # what the figure is of: "gpu3", "cpu0", "node", "group"
    metric: str  # "TFLOP/s" or "GB/s"
    value: float
    key: str  # the baseline this figure is compared with: sweep, device model, shape
    wrong: int = 0  # results that were not correct (all-reduce sums): a failure whatever the speed
    error: str = ""  # the job produced no figure: why
    detail: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        """How an operator names it: ``gemm node3 gpu3``, ``pairwise node3+node1``."""
        who = "+".join(self.nodes)
        return f"{self.sweep} {who} {self.unit}" if self.unit != "group" else f"{self.sweep} {who}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "nodes": list(self.nodes),
            "unit": self.unit,
            "metric": self.metric,
            "value": self.value,
            "key": self.key,
            "wrong": self.wrong,
            "error": self.error,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(
            sweep=str(data["sweep"]),
            nodes=tuple(data["nodes"]),
            unit=str(data["unit"]),
            metric=str(data["metric"]),
            value=float(data["value"]),
            key=str(data["key"]),
            wrong=int(data.get("wrong", 0)),
            error=str(data.get("error", "")),
            detail=dict(data.get("detail", {})),
        )


@dataclass(frozen=True)
class JobSpec:
    """What a plugin needs to build one sweep job."""

    nodes: tuple[str, ...]
    reservation: str
    out_dir: Path  # this sweep's directory in the store (shared by the job's nodes)
    tag: str  # unique per job within the sweep; names its output files
    duration_s: float
    scripts_dir: Path
    python: str
    time_limit_min: int
    partition: str = ""
    env: dict[str, str] = field(default_factory=dict)  # common job environment
    options: dict[str, Any] = field(default_factory=dict)  # plugin settings ([sweep] keys)

    def output(self) -> Path:
        return self.out_dir / f"{self.tag}.out"

    def request(self, script: str, args: Sequence[str], extra: Sequence[str] = ()) -> SubmitRequest:
        """An sbatch request for *script* (a file of the sweeps folder) on this job's nodes."""
        return SubmitRequest(
            script=str(self.scripts_dir / script),
            args=tuple(args),
            job_name=f"guardctl-{self.tag}",
            nodes=self.nodes,
            reservation=self.reservation,
            partition=self.partition,
            time_limit_min=self.time_limit_min,
            output=str(self.output()),
            env={**self.env, "GUARDCTL_SWEEP_OUT": str(self.out_dir)},
            # Not requeued after a node failure: the job ends NODE_FAIL and the sweep says so,
            # rather than waiting, pending on a dead node, for its timeout.
            extra=(
                f"--error={self.out_dir / (self.tag + '.err')}",
                "--no-requeue",
                *self._gpus(),
                *extra,
            ),
        )

    def _gpus(self) -> tuple[str, ...]:
        # Where GPUs are gres, a job that does not ask for them cannot see them.
        gpus = int(self.options.get("gpus_per_node", 0))
        return (f"--gpus-per-node={gpus}",) if gpus else ()


class SweepPlugin(Protocol):
    """A sweep: how to run it as a job, how to read its output, what it measures."""

    name: str
    scope: Scope  # single: one node per job; multi: a group of nodes per job

    def build(self, job: JobSpec) -> SubmitRequest:
        """The sbatch request that runs this sweep on ``job.nodes``."""
        ...

    def parse(self, text: str, nodes: tuple[str, ...]) -> list[Measurement]:
        """The measurements in a job's output (empty when it holds none)."""
        ...


PLUGINS: Registry[SweepPlugin] = Registry("sweep", "guardctl.sweep.plugins")


def register(plugin: SweepPlugin) -> SweepPlugin:
    """Add *plugin* under its name (called at the bottom of each plugin's module)."""
    return PLUGINS.add(plugin.name, plugin)


def get(name: str) -> SweepPlugin:
    return PLUGINS.get(name)


def names(scope: Scope | None = None) -> list[str]:
    return sorted(n for n, p in PLUGINS.items() if scope is None or p.scope == scope)
