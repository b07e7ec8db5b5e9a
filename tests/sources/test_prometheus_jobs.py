"""Peer groups from the exporter's ``hpc_job`` label, through a real Prometheus server.

Two jobs on disjoint nodes, no step records: job B's work runs its GPUs' SM clocks 580 MHz
below job A's (as a memory-bound job's may), and one node of job A runs 280 MHz below its
job's peers. With the label, each GPU is judged against its own job's GPUs: only that node
is suspect. Without it (``source.job_label = ""``) the fleet is one peer group whose spread
(the two jobs' clocks) hides the slow node: it is missed.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from promtools import PromServer, openmetrics, require_prometheus

from guardctl.analyze import Analysis
from guardctl.config import Settings
from guardctl.sections.source import SourceSettings
from guardctl.sources import Coverage, analyze_source, open_source
from guardctl.sources.dcgm_fields import exporter_series

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analyze"))

from anatrace import Trace

JOB_A = ["n1", "n2", "n3", "n4"]
JOB_B = ["n5", "n6", "n7", "n8"]
SCRAPE_S = 10.0


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    require_prometheus()
    tr = Trace(tmp_path_factory.mktemp("twojobs"), nodes=8, minutes=20, seed=11)
    tr.names = JOB_A + JOB_B
    tr.gpu["sm_clock_mhz"][:, [tr.node(n) for n in JOB_B], :] -= 580
    tr.gpu["sm_clock_mhz"][tr.at(2) :, tr.node("n2"), :] = 1700
    records = tr.records()
    for r in records:
        if r["kind"] == "gpu":
            r["job"] = "jobA" if r["node"] in JOB_A else "jobB"
    server = PromServer()
    try:
        server.backfill(openmetrics(exporter_series(records, SCRAPE_S, tr.t[0], tr.t[-1])))
        server.start()
        yield server.url, float(tr.t[-1])
    finally:
        server.stop()


def _analyze(url: str, at: float, **source: object) -> tuple[Analysis, Coverage]:
    cfg = SourceSettings(step_s=SCRAPE_S, retries=0, store_kinds=(), **source)  # type: ignore[arg-type]
    src = open_source(dataclasses.replace(Settings(), source=cfg), ("prometheus", url), None)
    result = analyze_source(src, at)
    assert src.coverage is not None
    return result, src.coverage


def test_a_slow_node_is_judged_against_its_own_jobs_peers(two_jobs: tuple[str, float]) -> None:
    result, cov = _analyze(*two_jobs)
    assert {n.node for n in result.suspects} == {"n2"}
    jobs = {n.node: n.job for n in result.nodes}
    assert jobs == {**dict.fromkeys(JOB_A, "jobA"), **dict.fromkeys(JOB_B, "jobB")}
    assert cov.given["gpu.job"] == "hpc_job label"


def test_without_the_label_the_fleet_is_one_peer_group(two_jobs: tuple[str, float]) -> None:
    result, cov = _analyze(*two_jobs, job_label="")
    verdicts = {n.node: n.verdict for n in result.nodes}
    assert verdicts == dict.fromkeys(JOB_A + JOB_B, "healthy")
    assert all(n.job is None for n in result.nodes)
    assert "gpu.job" not in cov.given
