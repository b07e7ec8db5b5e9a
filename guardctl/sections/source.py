"""[source]: where the analyzer's GPU and NIC telemetry comes from (the store or Prometheus)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

STORE_KINDS = ("gpu", "host", "nic", "step")


@dataclass(frozen=True)
class SourceSettings:
    """The default source of ``analyze``, ``report``, ``export`` and the controller.

    With ``kind = "prometheus"`` GPU and NIC telemetry come from dcgm-exporter and
    node_exporter series on the Prometheus server at ``url``; the record kinds in
    ``store_kinds`` (by default the probe's step records, the strongest signal, and
    the agent's host records, which no exporter gives) are still read from guardctl's
    store where it exists, into the same analysis.
    """

    kind: Literal["store", "prometheus"] = "store"
    url: str = ""  # e.g. http://prometheus:9090 (a path prefix is kept)
    store_kinds: tuple[str, ...] = ("step", "host")  # still read from the store, beside Prometheus
    step_s: float = 30.0  # query resolution: the exporter's scrape interval (dcgm-exporter: 30 s)
    max_points: int = 10_000  # steps per query (Prometheus refuses more than 11,000)
    timeout_s: float = 30.0  # per HTTP request
    retries: int = 2  # more tries after a transient failure (refused, timeout, 502/503/504)
    retry_backoff_s: float = 1.0  # doubled after each try
    bearer_token_file: str = ""  # a file holding the token (Authorization: Bearer)
    basic_auth_file: str = ""  # a file holding one "user:password" line
    selector: str = ""  # label matchers added to every query, e.g. cluster="a100"
    node_label: str = ""  # empty: Hostname, then hostname, then instance (port dropped)
    node_map: dict[str, str] = field(default_factory=dict)  # exporter name -> Slurm node
    # dcgm-exporter sets it with DCGM_HPC_JOB_MAPPING_DIR: the analyzer's peer groups where no
    # step record is
    job_label: str = "hpc_job"  # the exporter's label naming a GPU's job ("": not read)
    # where a GPU's job comes from: "label" (job_label only), "slurm" (the label where a series
    # has it, else the job Slurm ran on the node then: squeue --states=all), "none" (no jobs)
    jobs_from: Literal["label", "slurm", "none"] = "label"  # "slurm": label, else Slurm's job then

    def __post_init__(self) -> None:
        if self.kind == "prometheus" and not self.url:
            raise ValueError('url: needed when kind = "prometheus"')
        unknown = set(self.store_kinds) - set(STORE_KINDS)
        if unknown:
            raise ValueError(f"store_kinds: unknown kind {sorted(unknown)[0]!r}")
        if self.step_s <= 0:
            raise ValueError("step_s: must be positive")
        if not 2 <= self.max_points <= 11_000:
            raise ValueError("max_points: must be between 2 and 11000")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")
        if self.retries < 0 or self.retry_backoff_s < 0:
            raise ValueError("retries: must be >= 0")
        if self.bearer_token_file and self.basic_auth_file:
            raise ValueError("bearer_token_file: give either it or basic_auth_file, not both")
