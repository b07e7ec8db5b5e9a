"""GPU jobs from Slurm's job list (``source.jobs_from = "slurm"``), over the in-memory Slurm and
the squeue output captured from 22.05, 24.11 and 26.05; the real Slurm and Prometheus together
are in test_prometheus_slurm_jobs.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guardctl.analyze import Analysis, analyze_frame
from guardctl.analyze.frame import Frame
from guardctl.config import Settings
from guardctl.errors import ExitCode, SourceError
from guardctl.sections.slurm import SlurmSettings
from guardctl.sections.source import SourceSettings
from guardctl.slurm import parse
from guardctl.slurm.cli_backend import CliSlurm
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import JobInfo, SubmitRequest
from guardctl.sources import Coverage
from guardctl.sources.dcgm_fields import exporter_series
from guardctl.sources.prometheus import matrices, to_frame
from guardctl.sources.slurm_jobs import NodeJobs, Run, read_node_jobs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analyze"))

from anatrace import Trace

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SQUEUE_FILES = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.glob("slurm-*/squeue*.json"))
JOB_A = ["n1", "n2", "n3", "n4"]
JOB_B = ["n5", "n6", "n7", "n8"]


def _run(slurm: MemorySlurm, nodes: list[str]) -> int:
    return slurm.submit(SubmitRequest(script="train.sh", nodes=tuple(nodes)))


def test_each_node_takes_the_job_that_ran_on_it_then() -> None:
    slurm = MemorySlurm(["node1", "node2", "node3", "node4"], start=1000.0)
    first = _run(slurm, ["node1", "node2"])
    slurm.advance(100)
    second = _run(slurm, ["node3"])
    waiting = _run(slurm, ["node1", "node3"])  # pending behind both: ran nowhere
    slurm.advance(50)
    slurm.finish(first)  # at 1150; `waiting` still waits for node3
    slurm.advance(10)
    jobs = NodeJobs.from_jobs(slurm.recent_jobs())
    assert jobs.jobs == 2 and str(waiting) not in {r.job for rs in jobs.runs.values() for r in rs}
    assert jobs.at("node1", 999.0) is None  # before the job started
    assert jobs.at("node1", 1000.0) == jobs.at("node2", 1150.0) == str(first)
    assert jobs.at("node1", 1151.0) is None  # after it ended
    assert jobs.at("node3", 1100.0) == jobs.at("node3", 9e9) == str(second)  # still running
    assert jobs.at("node4", 1100.0) is None  # idle
    assert (jobs.attributed, jobs.unknown, jobs.shared) == (4, 3, 0)


def test_an_ended_job_is_forgotten_after_min_job_age() -> None:
    slurm = MemorySlurm(["node1"], start=1000.0, min_job_age_s=300)
    slurm.finish(_run(slurm, ["node1"]))
    slurm.advance(299)
    assert NodeJobs.from_jobs(slurm.recent_jobs()).at("node1", 1000.0) == "1"
    slurm.advance(1)
    assert NodeJobs.from_jobs(slurm.recent_jobs()).at("node1", 1000.0) is None


def test_a_node_shared_by_two_jobs_gives_no_job() -> None:
    both = [
        JobInfo(7, "a", "u", "RUNNING", ("node1",), start_time=100.0),
        JobInfo(8, "b", "u", "COMPLETED", ("node1", "node2"), start_time=150.0, end_time=200.0),
    ]
    jobs = NodeJobs.from_jobs(both)
    assert jobs.at("node1", 120.0) == "7"
    assert jobs.at("node1", 170.0) is None and jobs.shared == 1  # which GPU is whose: unknown
    assert jobs.at("node2", 170.0) == "8" and jobs.at("node1", 250.0) == "7"


@pytest.mark.parametrize("name", SQUEUE_FILES)
def test_captured_squeue_gives_the_running_job_its_node(name: str) -> None:
    # The captured scene: job 1 runs on node1, job 2 is pending (every data_parser version).
    jobs = NodeJobs.from_jobs(parse.jobs_from_json((FIXTURES / name).read_text()))
    [run] = jobs.runs["node1"]
    assert jobs.runs == {"node1": [Run("1", run.start, math.inf)]}  # not its time limit
    assert jobs.jobs == 1 and run.start > 1.7e9
    assert jobs.at("node1", run.start + 3600) == "1" and jobs.at("node1", run.start - 1) is None


def test_slurm_that_cannot_be_read_is_a_source_error(tmp_path: Path) -> None:
    slurm = CliSlurm(SlurmSettings(bin_dir=str(tmp_path)))  # a bin dir without squeue
    with pytest.raises(SourceError) as err:
        read_node_jobs(slurm)
    assert err.value.exit_code == ExitCode.INPUT
    assert str(err.value).startswith('source.jobs_from = "slurm": cannot read Slurm\'s jobs: ')
    assert "not found in slurm.bin_dir" in str(err.value)  # sinfo --version asks first


# --- the mapping and the analyzer: two jobs on disjoint nodes, as the real-Prometheus test ------


def _two_jobs(tmp_path: Path, labelled: tuple[str, ...] = ()) -> tuple[Trace, list[Any]]:
    """Job B's work runs its clocks 580 MHz below job A's; n2 of job A is 280 MHz slow.
    GPU records of *labelled* nodes carry an hpc_job label naming job "lbl"."""
    tr = Trace(tmp_path, nodes=8, minutes=20, seed=11)
    tr.names = JOB_A + JOB_B
    tr.gpu["sm_clock_mhz"][:, [tr.node(n) for n in JOB_B], :] -= 580
    tr.gpu["sm_clock_mhz"][tr.at(2) :, tr.node("n2"), :] = 1700
    records = tr.records()
    for r in records:
        if r["kind"] == "gpu" and r["node"] in labelled:
            r["job"] = "lbl"
    return tr, records


def _frame(
    tr: Trace, records: list[Any], jobs: NodeJobs | None, **cfg: Any
) -> tuple[Frame, Coverage]:
    series = matrices(exporter_series(records, 10.0, float(tr.t[0]), float(tr.t[-1])))
    source = SourceSettings(step_s=10.0, **cfg)
    return to_frame(lambda m, stamps: [] if stamps else series.get(m, []), source, "", jobs)


def _jobs_of(frame: Frame) -> dict[str, set[str]]:
    gpu = frame.cols["gpu"]
    out: dict[str, set[str]] = {}
    for node, job in zip(gpu["node"], gpu["job"], strict=True):
        out.setdefault(frame.nodes[node], set()).add(frame.jobs[job] if job >= 0 else "")
    return out


def _analyze(tr: Trace, frame: Frame) -> Analysis:
    return analyze_frame(frame, Settings().analyze, at=float(tr.t[-1]))


@pytest.fixture
def fleet_slurm() -> Any:
    def make(tr: Trace) -> MemorySlurm:
        slurm = MemorySlurm(JOB_A + JOB_B, start=float(tr.t[0]) - 60)
        _run(slurm, JOB_A), _run(slurm, JOB_B)
        slurm.advance(float(tr.t[-1] - tr.t[0]) + 120)
        return slurm

    return make


def test_slurms_jobs_make_the_peer_groups(tmp_path: Path, fleet_slurm: Any) -> None:
    tr, records = _two_jobs(tmp_path)
    jobs = NodeJobs.from_jobs(fleet_slurm(tr).recent_jobs())
    frame, cov = _frame(tr, records, jobs, jobs_from="slurm")
    assert _jobs_of(frame) == {**{n: {"1"} for n in JOB_A}, **{n: {"2"} for n in JOB_B}}
    result = _analyze(tr, frame)
    assert {n.node for n in result.suspects} == {"n2"}
    assert {n.node: n.job for n in result.nodes} == {
        **dict.fromkeys(JOB_A, "1"),
        **dict.fromkeys(JOB_B, "2"),
    }
    assert cov.given["gpu.job"] == "Slurm's jobs"
    gpu_samples = int(np.sum(frame.cols["gpu"]["job"] >= 0))
    assert cov.to_dict()["jobs"] == {
        "from": "slurm",
        "jobs": 2,
        "samples_with_job": gpu_samples,
        "samples_without_job": 0,
        "samples_on_shared_nodes": 0,
    }
    assert "jobs from Slurm: 2 jobs" in cov.summary()
    # The same series without jobs: one peer group, whose spread hides n2.
    alone = _analyze(tr, _frame(tr, records, None)[0])
    assert {n.node: n.verdict for n in alone.nodes} == dict.fromkeys(JOB_A + JOB_B, "healthy")


def test_a_label_wins_over_slurm(tmp_path: Path, fleet_slurm: Any) -> None:
    tr, records = _two_jobs(tmp_path, labelled=("n7", "n8"))
    jobs = NodeJobs.from_jobs(fleet_slurm(tr).recent_jobs())
    frame, cov = _frame(tr, records, jobs, jobs_from="slurm")
    assert _jobs_of(frame) == {
        **{n: {"1"} for n in JOB_A},
        "n5": {"2"},
        "n6": {"2"},
        "n7": {"lbl"},
        "n8": {"lbl"},
    }
    assert cov.given["gpu.job"] == "hpc_job label, else Slurm's jobs"


def test_jobs_from_none_reads_no_label(tmp_path: Path) -> None:
    tr, records = _two_jobs(tmp_path, labelled=tuple(JOB_A + JOB_B))
    frame, cov = _frame(tr, records, None, jobs_from="none")
    assert set().union(*_jobs_of(frame).values()) == {""}
    assert "gpu.job" not in cov.given and cov.to_dict()["jobs"] == {"from": "none"}
    labelled, _ = _frame(tr, records, None)  # the default, "label"
    assert set().union(*_jobs_of(labelled).values()) == {"lbl"}
