"""The cluster simulation's parameters, each with where its value comes from.

Field studies give the rates; where a study gives no number the value is marked as an
assumption here and in docs/simulation.md, so that a reader can tell the two apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DAY = 86400.0
HOUR = 3600.0


@dataclass(frozen=True)
class Params:
    """One simulated cluster: its size, its jobs, its faults and the analyzer's quality."""

    nodes: int = 2000  # 8 GPUs each: 2000 nodes is Llama 3's 16k GPUs
    gpus_per_node: int = 8
    days: float = 7.0
    seed: int = 0
    # -- jobs (assumptions: a training partition of large jobs, a batch partition of small) --
    train_share: float = 0.8  # of the nodes: the large jobs' partition, spares included
    large_nodes: int = 128  # nodes of one large synchronous job (1024 GPUs)
    large_fill: float = 0.9  # of the training partition the large jobs take; the rest: spares
    checkpoint_s: float = 1800.0  # checkpoint interval (also [control] checkpoint_interval_s)
    restart_s: float = 600.0  # start-up and checkpoint load of a restarted job
    small_nodes_max: int = 8  # small jobs take 1..8 nodes
    small_hours: float = 4.0  # mean runtime of a small job
    small_load: float = 0.9  # offered load of the batch partition
    # -- fail-stop (Meta, arXiv 2410.21680; Llama 3: 58.7% of interruptions GPU-related) --
    failstop_per_1000_node_days: float = 6.5
    failstop_gpu_share: float = 0.587  # a GPU lost while slurmd lives on: Slurm does not see it
    repair_s: float = 2 * DAY  # assumption: a failed or drained node comes back repaired
    hang_s: float = 1800.0  # assumption: a job on a lost GPU hangs until the NCCL watchdog
    notice_s: float = 12 * HOUR  # assumption: without health checks an operator notices
    nhc_interval_s: float = 300.0  # NHC / prolog checks every 5 minutes
    # -- fail-slow (FALCON, arXiv 2410.12588) --
    failslow_per_1000_node_days: float = 10.0  # assumption: FALCON gives no per-node rate
    failslow_comm_share: float = 0.7  # communication fail-slows are the more frequent kind
    failslow_compute_mean_s: float = 600.0  # ~10 min
    failslow_comm_mean_s: float = 1440.0  # ~24 min
    failslow_min_s: float = 10.0  # from seconds ...
    failslow_max_s: float = 10 * HOUR  # ... to ~10 h
    slow_low: float = 1.10  # MegaScale: hosts ~10% slower for the same compute
    slow_high: float = 1.34  # FALCON: fail-slows stretch jobs ~1.34x
    # -- persistent grey nodes (MegaScale; Guard: common enough to matter) --
    grey_share: float = 0.02  # assumption: 2% of the nodes grey at the start ("common")
    grey_per_1000_node_days: float = 1.0  # assumption: new grey nodes appear
    grey_reveal_mean_s: float = 600.0  # assumption: burn-in seconds until a grey node fails it
    lemon_share: float = 0.005  # assumption: intermittently slow nodes that pass short sweeps
    lemon_on_mean_s: float = 2 * HOUR
    lemon_off_mean_s: float = 10 * HOUR
    # -- confounders that must not cost a node --
    contention_per_node_day: float = 1.0  # assumption: host contention spikes
    contention_mean_s: float = 120.0
    contention_slow: float = 1.2
    stall_per_job_hour: float = 1.0  # checkpoint and data stalls of a whole job (assumption)
    stall_mean_s: float = 180.0
    stall_slow: float = 1.5
    imbalance_share: float = 0.425  # ByteDance, arXiv 2505.05713: 42.5% of large jobs straggle
    imbalance_slow: float = 1.10  # assumption: the slowest pipeline stage's excess
    pipeline_stages: int = 8
    # -- the network tree (assumptions: a leaf switch per 32 nodes, 8 leaves to a spine group) --
    leaf_nodes: int = 32
    spine_leaves: int = 8
    # -- fabric faults (off unless *fabric*; FALCON, arXiv 2410.12588: communication fail-slows
    # are the common kind, mean 24 min, seconds to ~10 h; Aegis: they trace to a ToR switch, an
    # aggregation switch or an optic). No study gives a per-switch rate: the rates are
    # assumptions, a few episodes of each kind a week at 2000 nodes.
    fabric: bool = False
    leaf_per_100_leaf_days: float = 1.0  # a degraded leaf switch
    leaf_mean_s: float = 1440.0  # FALCON's communication fail-slows: ~24 min
    uplink_per_100_leaf_days: float = 1.0  # a leaf's uplinks flapping
    uplink_mean_s: float = 2 * HOUR  # assumption: the flapping lasts until someone reseats it
    uplink_on_mean_s: float = 600.0  # assumption: degraded while a flap settles ...
    uplink_off_mean_s: float = 300.0  # ... then well for a while
    spine_per_10_group_days: float = 1.0  # a congested spine group
    spine_mean_s: float = 1440.0  # FALCON, as the leaf
    cable_per_1000_node_days: float = 1.0  # one node's bad cable (or NIC, or optic): until its
    # node is drained and repaired
    # -- the analyzer (bench/detect_quality.py, docs/analyzer.md) --
    detect_delay_s: float = 1.33 * 300.0  # median time to detect: 1.33 windows of 300 s
    recall: float = 1.0  # 320 of 320 faults found
    # Its false suspects: none measured in 78,400 healthy node-passes (200 passes over each of
    # the faulty fleets of 32, 96 and 256 nodes less their faulty nodes, 25 over each clean
    # one); modelled at the rate that measurement cannot rule out, the rule of three's 95%
    # bound, 3 / 78,400 per node and pass. 0 turns them off.
    false_positive_per_node_pass: float = 3.8e-5
    detect_min_slow: float = 1.05  # assumption: a node this much slower shows in busy time
    pass_s: float = 300.0  # a controller pass every 5 minutes
    sweep_s: float = 300.0  # [sweep] gemm_duration_s
    # -- guardctl's [safety] (its node-action door's caps and rate limit) --
    max_out_fraction: float = 0.10  # safety.max_out_fraction, guardctl's default
    max_out_nodes: int | None = None  # None: the fraction alone (assumption: the operator of a
    # fleet sizes the cap to it; guardctl's default of 16 nodes suits a small one)
    max_actions_per_hour: int = 60  # safety.max_actions_per_hour, guardctl's default

    def __post_init__(self) -> None:
        if self.nodes < 8:
            raise ValueError("nodes: at least 8")
        if self.days <= 0:
            raise ValueError("days: must be positive")
        if not 0.0 <= self.recall <= 1.0:
            raise ValueError("recall: must be in [0, 1]")
        if self.leaf_nodes < 1 or self.spine_leaves < 1:
            raise ValueError("leaf_nodes, spine_leaves: at least 1")
        if not 0.0 <= self.false_positive_per_node_pass < 1.0:
            raise ValueError("false_positive_per_node_pass: must be in [0, 1)")

    @property
    def horizon_s(self) -> float:
        return self.days * DAY

    def scaled(self, factor: float) -> Params:
        """The same cluster with every fault rate (not the confounders) times *factor*."""
        return dataclasses.replace(
            self,
            failstop_per_1000_node_days=self.failstop_per_1000_node_days * factor,
            failslow_per_1000_node_days=self.failslow_per_1000_node_days * factor,
            grey_share=min(1.0, self.grey_share * factor),
            grey_per_1000_node_days=self.grey_per_1000_node_days * factor,
            lemon_share=min(1.0, self.lemon_share * factor),
            leaf_per_100_leaf_days=self.leaf_per_100_leaf_days * factor,
            uplink_per_100_leaf_days=self.uplink_per_100_leaf_days * factor,
            spine_per_10_group_days=self.spine_per_10_group_days * factor,
            cable_per_1000_node_days=self.cable_per_1000_node_days * factor,
        )

    def fault_free(self) -> Params:
        """No node or fabric faults; the confounders, a property of the work, stay."""
        return self.scaled(0.0)

    def calm(self) -> Params:
        """No faults, no confounders, no false suspects: every job at full speed."""
        return dataclasses.replace(
            self.fault_free(),
            contention_per_node_day=0.0,
            stall_per_job_hour=0.0,
            imbalance_share=0.0,
            false_positive_per_node_pass=0.0,
        )
