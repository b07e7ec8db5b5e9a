"""Peer groups from Slurm's own jobs, for exporters without ``hpc_job``: a real Slurm lab and a
real Prometheus, guardctl as a process.

test_prometheus_jobs.py's scene, with the jobs real: two sleep jobs on disjoint lab nodes
(node1-4, node5-8); while they run, the exporter series of the lab's nodes (no job label) show
job B's clocks 580 MHz below job A's and node2 280 MHz below its job's peers. The series are
backfilled into a Prometheus; job B is then cancelled, so its nodes' job comes from a job that
has ended (``squeue --states=all``). ``source.jobs_from = "slurm"`` finds node2, each node with
its Slurm job; ``"label"`` (no label here) makes the fleet one peer group and misses it; a
stopped slurmctld is one line and exit 7, never a verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from labtools import Lab
from promtools import PromServer, openmetrics, require_prometheus

from guardctl.slurm import parse
from guardctl.sources.dcgm_fields import exporter_series

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analyze"))

from anatrace import Trace

SCRAPE_S = 2.0
WINDOW_S = 20  # three windows of ten scrapes: the lab's jobs need run only a minute
SLEEP = "#!/bin/sh\nsleep 900\n"


@dataclass
class Scene:
    lab: Lab
    server: PromServer
    config: Path
    at: float
    job_a: str
    job_b: str

    def analyze(self, *more: str) -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "guardctl",
            "--config",
            str(self.config),
            *more,
            "analyze",
            "--from",
            "prometheus",
            self.server.url,
            "--at",
            f"{self.at:.3f}",
            "--json",
        ]
        env = {k: v for k, v in self.lab.env.items() if not k.startswith("GUARDCTL_")}
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _running(lab: Lab, *job_ids: str, timeout: float = 60) -> dict[str, float]:
    """Each job's start time, once all of them run."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = {str(j.job_id): j for j in parse.jobs_from_json(lab.sh("squeue", "--json").stdout)}
        if all(jobs.get(j) and jobs[j].state == "RUNNING" for j in job_ids):
            return {j: float(jobs[j].start_time or 0) for j in job_ids}
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs {job_ids} not running after {timeout} s: {jobs}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def scene(lab_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    require_prometheus()
    lab: Lab = lab_factory(nodes=8)
    job_a = lab.submit(SLEEP, "-w", "node[1-4]", "-N4", "-J", "jobA")
    job_b = lab.submit(SLEEP, "-w", "node[5-8]", "-N4", "-J", "jobB")
    started = _running(lab, job_a, job_b)
    tmp = tmp_path_factory.mktemp("slurmjobs")
    tr = Trace(tmp, nodes=8, minutes=1, interval=SCRAPE_S, seed=11)
    tr.names = list(lab.nodes)
    tr.t = tr.t - tr.t[0] + max(started.values()) + 1  # while both jobs run
    tr.gpu["sm_clock_mhz"][:, [tr.node(f"node{i}") for i in range(5, 9)], :] -= 580
    tr.gpu["sm_clock_mhz"][:, tr.node("node2"), :] = 1700
    at = float(tr.t[-1]) + 1
    time.sleep(max(0.0, at + 1 - time.time()))  # the trace is over: job B may end now
    lab.sh("scancel", job_b)
    lab.wait_job(job_b)
    config = tmp / "guardctl.toml"
    config.write_text(
        f'[store]\nroot = "{tmp / "store"}"\n[slurm]\n{lab.slurm_toml()}timeout_s = 30.0\n'
        f"[analyze]\nwindow_s = {WINDOW_S}\n"
        f'[source]\nstep_s = {SCRAPE_S}\nretries = 0\nstore_kinds = []\njobs_from = "slurm"\n'
    )
    server = PromServer()
    try:
        records = tr.records()
        server.backfill(openmetrics(exporter_series(records, SCRAPE_S, tr.t[0], tr.t[-1] + 1)))
        server.start()
        yield Scene(lab, server, config, at, job_a, job_b)
    finally:
        server.stop()


def test_slurms_jobs_find_the_slow_node(scene: Scene) -> None:
    proc = scene.analyze()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    nodes = {n["node"]: n for n in out["nodes"]}
    assert {n for n, v in nodes.items() if v["verdict"] == "suspect"} == {"node2"}, nodes
    assert {n: v["job"] for n, v in nodes.items()} == {
        **{f"node{i}": scene.job_a for i in range(1, 5)},
        **{f"node{i}": scene.job_b for i in range(5, 9)},  # ended: squeue --states=all
    }
    source = out["source"]
    assert source["given"]["gpu.job"] == "Slurm's jobs"
    jobs = source["jobs"]
    assert jobs["from"] == "slurm" and jobs["jobs"] >= 2
    assert jobs["samples_with_job"] > 0 and jobs["samples_on_shared_nodes"] == 0


def test_without_slurms_jobs_the_slow_node_is_missed(scene: Scene) -> None:
    proc = scene.analyze("--set", "source.jobs_from=label")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert {n["node"]: n["verdict"] for n in out["nodes"]} == dict.fromkeys(
        scene.lab.nodes, "healthy"
    )
    assert out["source"]["jobs"] == {"from": "label"}


def test_slurm_down_is_one_line_and_exit_7(scene: Scene) -> None:
    scene.lab.stop_controller()
    try:
        proc = scene.analyze()
    finally:
        scene.lab.start_controller()
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert proc.stdout == ""  # no verdict
    [line] = proc.stderr.splitlines()
    assert line.startswith('guardctl: error: source.jobs_from = "slurm": cannot read Slurm\'s jobs')
