"""[sweep]: burn-in and all-reduce sweeps, their pass criteria and how suspects are paired."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from guardctl.topology import split_component


@dataclass(frozen=True)
class SweepReference:
    """A reference for one baseline key or key prefix, ReFrame-style: a value with bounds."""

    value: float = 0.0  # a fixed reference figure; 0: the learnt baseline (or the fleet median)
    lower: float | None = None  # pass at >= (1 + lower) x reference, e.g. -0.05; None: tolerance
    upper: float | None = None  # fail above (1 + upper) x reference (too good to be true)
    floor: float = 0.0  # the reference never goes below this, however low the fleet drifts

    def __post_init__(self) -> None:
        if self.value < 0 or self.floor < 0:
            raise ValueError("value and floor: must be >= 0")
        if self.lower is not None and not -1.0 < self.lower <= 0.0:
            raise ValueError("lower: must be in (-1, 0]")
        if self.upper is not None and self.upper < 0.0:
            raise ValueError("upper: must be >= 0")


@dataclass(frozen=True)
class SweepSettings:
    """Durations, tolerances, pairing and where the sweep job scripts live."""

    gemm_duration_s: float = 300.0  # some GPUs slow down only after minutes
    tolerance: float = 0.92  # pass at >= tolerance x baseline (or fleet median)
    repeat_failures: int = 1  # a failure is repeated this many times before it counts
    scripts_dir: str = ""  # empty: the sweeps/ folder shipped with guardctl
    python: str = ""  # interpreter for the sweep programs; empty: the one running guardctl
    job_timeout_s: float = 3600.0
    partition: str = ""
    gpus_per_node: int = 0  # sweep jobs ask --gpus-per-node=N (sites with GPU gres); 0: not
    poll_interval_s: float = 2.0  # how often job states are read while waiting
    # Multi-node sweeps: who partners the suspects and how they are grouped.
    pairing: Literal["regroup", "two_round", "one_vs_good"] = "regroup"
    group_size: int = 2  # suspects per group in the first pairing round
    partners: int = 1  # known-good nodes in each isolating test (1 or 2)
    good_nodes: tuple[str, ...] = ()  # known-good partners; empty: idle in-service nodes
    reservation_prefix: str = "guardctl_s_"  # multi-node sweep reservations
    # Sweep programs' knobs.
    gemm_size: int = 0  # matrix size; 0: the program's default (8192 GPU, 1024 CPU)
    gemm_threads: int = 0  # BLAS threads on CPU-only nodes; 0: the job's CPUs
    allreduce_max_bytes: int = 64 << 20  # allreduce.py's largest message
    allreduce_iters: int = 5
    cpu_tasks: int = 2  # all-reduce ranks per CPU-only node
    nccl_tests: bool = True  # use nccl-tests' all_reduce_perf when it is on PATH
    # Baselines.
    learn_baselines: bool = True  # passing figures update the baselines
    baseline_history: int = 20  # passing figures a baseline is the median of
    # Per key (gemm|NVIDIA H200|8x) or key prefix (gemm|NVIDIA H200, gemm): a fixed reference,
    # its bounds and a floor, e.g. "gemm|NVIDIA H200" = { lower = -0.05, floor = 700 }.
    references: dict[str, SweepReference] = field(
        default_factory=dict
    )  # {value, lower, upper, floor} per key or key prefix (longest wins)
    # Qualification (guardctl qualify): nodes back from someone else's repair are swept before
    # production work lands on them, and a sample of idle healthy nodes keeps the baselines
    # honest.
    qualify_sample: int = 0  # idle in-service nodes swept per qualify pass; 0: none
    qualify_interval_s: float = 7 * 86400.0  # a sampled node is swept again after this long
    # Slurm hooks (prolog, epilog, HealthCheckProgram): quick checks only.
    hook_gpus: int = 0  # GPUs every node should show; 0: do not check the count
    hook_xid_window_s: float = 600.0  # a hardware XID this recent fails the node
    hook_ib_min_rate_gbps: float = 0.0  # 0: a port slower than the node's fastest fails
    # Fault injection for tests and demos: node -> speed factor in (0, 1] applied by the
    # sweep programs on that node (e.g. { node3 = 0.5 }), or a fabric component's, applied to
    # the pairwise jobs whose traffic goes through it (e.g. { "leaf:s2" = 0.1 }). Never set
    # this in production.
    inject: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gemm_duration_s <= 0:
            raise ValueError("gemm_duration_s: must be positive")
        if not 0.0 < self.tolerance <= 1.0:
            raise ValueError("tolerance: must be in (0, 1]")
        if self.repeat_failures < 0:
            raise ValueError("repeat_failures: must be >= 0")
        if self.job_timeout_s <= 0 or self.poll_interval_s <= 0:
            raise ValueError("job_timeout_s and poll_interval_s: must be positive")
        if self.gpus_per_node < 0:
            raise ValueError("gpus_per_node: must be >= 0")
        if self.group_size < 2:
            raise ValueError("group_size: must be >= 2")
        if self.partners not in (1, 2):
            raise ValueError("partners: must be 1 or 2")
        if not self.reservation_prefix.replace("_", "").isalnum():
            raise ValueError("reservation_prefix: letters, digits and '_' only")
        if self.allreduce_max_bytes < 4096 or self.allreduce_iters < 1 or self.cpu_tasks < 1:
            raise ValueError("allreduce_max_bytes, allreduce_iters, cpu_tasks: too small")
        if self.baseline_history < 1:
            raise ValueError("baseline_history: must be >= 1")
        if self.hook_gpus < 0 or self.hook_xid_window_s <= 0 or self.hook_ib_min_rate_gbps < 0:
            raise ValueError("hook_gpus, hook_xid_window_s, hook_ib_min_rate_gbps: out of range")
        if self.qualify_sample < 0 or self.qualify_interval_s <= 0:
            raise ValueError("qualify_sample: must be >= 0; qualify_interval_s: positive")
        for node, factor in self.inject.items():
            if not 0.0 < factor <= 1.0:
                raise ValueError(f"inject.{node}: must be in (0, 1]")
            if ":" in node:
                split_component(node)  # a fabric component's: leaf:s2, uplink:s2, spine:s0
