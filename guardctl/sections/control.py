"""[control]: the mitigation controller (``guardctl control``): when it acts, and its limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from guardctl.errors import UsageError
from guardctl.nodes import expand


@dataclass(frozen=True)
class ControlSettings:
    """The controller's switches, its ladder, its fleet-wide-cause limits and its cost model."""

    act: bool = False  # observe only (record what it would do) unless true or --act
    interval_s: float = 60.0  # a daemon's pause between passes
    # A window judged once is then judged again unchanged by the pass a window length later,
    # which keeps its figures (a daemon's pass judges one window in three).
    align: bool = True  # a daemon's windows end on a multiple of its interval, not the newest
    lease_s: float = 180.0  # the leader lease lasts this long unless renewed
    max_clock_skew_s: float = 30.0  # hosts' clocks further apart: the controller does not act
    # The ladder.
    sweep_kind: Literal["single", "multi", "all"] = "all"  # a freed node's sweep
    sweep_duration_s: float = 0.0  # GEMM burn-in seconds; 0: sweep.gemm_duration_s
    relapse_window_s: float = 7 * 86400.0  # flagged again this soon after a pass: a relapse
    relapse_sweep_factor: float = 3.0  # a relapse's sweep is this many times longer
    relapses: int = 2  # the relapses-th relapse is swept once more, then drained as a lemon
    # Safety, on top of [safety].
    max_actions_per_hour: int = 20  # the controller's own node actions
    max_job_fraction: float = 0.5  # more of one job's nodes suspect at once: the job's cause
    max_rack_fraction: float = 0.5  # more of one rack's nodes suspect at once: the rack's cause
    max_fleet_fraction: float = 0.2  # more of the fleet suspect at once: a fleet-wide cause
    min_group: int = 3  # a common cause needs at least this many nodes at fault at once
    racks: dict[str, str] = field(default_factory=dict)  # rack -> hostlist, e.g. {r1="n[1-16]"}
    # A fabric finding (a leaf switch, an uplink, a spine group, a node's link) takes no node
    # action by default: the nodes behind it are not at fault.
    fabric_quarantine: bool = False  # quarantine a fabric finding's nodes till it clears (capped)
    models: dict[str, str] = field(default_factory=dict)  # device model -> hostlist
    flap_window_s: float = 3600.0
    max_flaps: int = 3  # suspect onsets in flap_window_s past which a node is left alone
    # Requeue (ski rental): restart cost against the loss of running slow.
    requeue: bool = False  # may requeue a requeue-able job off its slow node
    checkpoint_interval_s: float = 1800.0  # work lost on a restart is half of it on average
    restart_s: float = 300.0  # start-up and checkpoint load of a restarted job
    queue_wait_s: float = 300.0  # expected wait in the queue before it runs again
    signal: str = ""  # sent to the job before a requeue (e.g. USR1: checkpoint now); empty: none
    signal_grace_s: float = 60.0  # how long the job gets to act on the signal
    gpus_per_node: int = 8  # a node's GPUs where Slurm does not say
    # Rung a: a job whose data-sharding service already gives the slow rank less work.
    recovery: float = 0.5  # rung a: the step time must win back this share of the slowdown
    rebalance_window_s: float = 900.0  # rung a: no recovery within this long: quarantine the node
    # Sweeps whose jobs measured nothing (undetermined): the node stays quarantined.
    max_undetermined: int = 3  # undetermined sweeps of a node before it is left to an operator
    undetermined_retry_s: float = 600.0  # wait before sweeping it again, doubled each time
    # So many nodes undetermined within the window: the sweeps are broken, not the nodes.
    undetermined_fleet_nodes: int = 3  # nodes undetermined at once: a fleet-wide finding, no sweeps
    undetermined_window_s: float = 3600.0  # the span undetermined_fleet_nodes is counted over

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.lease_s <= 0 or self.max_clock_skew_s <= 0:
            raise ValueError("interval_s, lease_s, max_clock_skew_s: must be positive")
        if (
            min(
                self.sweep_duration_s,
                self.relapse_window_s,
                self.flap_window_s,
                self.rebalance_window_s,
            )
            < 0
        ):
            raise ValueError(
                "sweep_duration_s, relapse_window_s, flap_window_s, "
                "rebalance_window_s: must be >= 0"
            )
        if self.relapse_sweep_factor < 1 or self.relapses < 1 or self.max_flaps < 1:
            raise ValueError("relapse_sweep_factor, relapses, max_flaps: must be >= 1")
        if self.max_actions_per_hour < 1 or self.min_group < 1:
            raise ValueError("max_actions_per_hour, min_group: must be >= 1")
        for name in ("max_job_fraction", "max_rack_fraction", "max_fleet_fraction", "recovery"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: must be in (0, 1]")
        if (
            min(self.checkpoint_interval_s, self.restart_s, self.queue_wait_s, self.signal_grace_s)
            < 0
        ):
            raise ValueError(
                "checkpoint_interval_s, restart_s, queue_wait_s, signal_grace_s: must be >= 0"
            )
        if self.max_undetermined < 1 or self.undetermined_fleet_nodes < 2:
            raise ValueError("max_undetermined: must be >= 1; undetermined_fleet_nodes: >= 2")
        if not (
            0 <= self.undetermined_retry_s < float("inf")
            and 0 <= self.undetermined_window_s < float("inf")
        ):
            raise ValueError("undetermined_retry_s, undetermined_window_s: must be finite, >= 0")
        if self.gpus_per_node < 1:
            raise ValueError("gpus_per_node: must be >= 1")
        # Expanded once here, so that a bad hostlist is a configuration error at load rather
        # than a failure of every pass that classifies the fleet.
        for key, groups in (("racks", self.racks), ("models", self.models)):
            for name, hostlist in groups.items():
                try:
                    expand(hostlist)
                except UsageError as exc:
                    raise ValueError(f"{key}.{name}: {exc}") from None
