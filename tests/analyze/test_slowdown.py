"""A job slowed on every rank alike is judged against its own history: a job-level finding with
what it costs, never a node's; a job with one slow node stays that node's matter; a job too
young for a baseline is ``unknown``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from anatrace import T0, Trace, verdicts
from click.testing import CliRunner
from test_incremental import Replay

from guardctl.analyze import analyze
from guardctl.analyze.features import Features, Table
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.slowdown import Rule, find
from guardctl.cli import main
from guardctl.config import load_settings
from guardctl.simulate import simulate

ONSET = 19.5  # minutes into a 30-minute trace: the last two of its 5-minute windows are slower


def slowed_trace(root: Path, factor: float = 1.5, minutes: int = 30) -> Trace:
    """One job on six nodes whose every rank computes *factor* longer from ONSET on."""
    tr = Trace(root, minutes=minutes)
    tr.slow[tr.at(ONSET) :, :, :] = factor
    return tr


# --- the module on its own -------------------------------------------------------------------


def features(steps: dict[int, float], history: dict[int, float], ranks: int = 4) -> Features:
    """One job ("j1") of *ranks* ranks on as many nodes, its step time per judged window
    (*steps*, 0 newest) and per history window (*history*), ten steps a rank in each."""
    rows = [(w, r, s) for w, s in steps.items() for r in range(ranks)]
    rank = Table(
        {
            "w": np.array([w for w, _, _ in rows], np.int64),
            "job": np.zeros(len(rows), np.int64),
            "node": np.array([r for _, r, _ in rows], np.int64),
            "n": np.full(len(rows), 10, np.int64),
            "step_med": np.array([s for _, _, s in rows]),
        }
    )
    old = Table(
        {
            "w": np.array(list(history), np.int64),
            "job": np.zeros(len(history), np.int64),
            "step": np.array(list(history.values())),
            "ranks": np.full(len(history), ranks, np.int64),
        }
    )
    empty = Table({})
    nodes = [f"n{i}" for i in range(ranks)]
    none = np.zeros((3, ranks), bool)
    return Features(
        T0, 300.0, 3, nodes, ["j1"], [], empty, empty, empty, rank, ~none, ~none, none, old
    )


RULE = Rule(slowdown=0.25, windows=2, own_history=3, min_samples=3)


def test_a_job_slower_than_its_own_history_in_two_windows_is_slowed_with_its_cost() -> None:
    f = features({0: 15.0, 1: 14.0, 2: 10.0}, {3: 10.0, 4: 9.0, 5: 11.0})
    (pace,) = find(f, np.zeros((3, 4), bool), RULE)
    assert (pace.verdict, pace.windows, pace.baseline_s, pace.step_s) == ("slowed", 2, 10.0, 15.0)
    assert pace.nodes == ("n0", "n1", "n2", "n3") and pace.ranks == 4
    impact = pace.impact
    assert impact is not None
    assert (impact["ratio"], impact["s_per_step_lost"], impact["pct"]) == (1.5, 5.0, 33.3)
    # 4 GPUs over two 300 s windows at 1/3 and 2/7 of each step lost
    assert impact["gpu_h_lost"] == round(4 * 300 * (1 / 3 + 4 / 14) / 3600, 2)
    assert "1.50x its own earlier pace" in pace.why and "not a node fault" in pace.why


def test_one_slower_window_is_not_enough_and_a_flagged_node_makes_it_the_nodes_matter() -> None:
    one = find(features({0: 15.0, 1: 10.0, 2: 10.0}, {3: 10.0, 4: 10.0}), np.zeros((3, 4)), RULE)
    assert one[0].verdict == "steady" and one[0].impact is None
    assert "in 1 of 3 windows (needs 2)" in one[0].why
    hit = np.zeros((3, 4), bool)
    hit[:2, 2] = True  # node n2 flagged by its peers where the job was slower
    (node,) = find(features({0: 15.0, 1: 15.0, 2: 10.0}, {3: 10.0, 4: 10.0}), hit, RULE)
    assert node.verdict == "steady" and "that node's matter" in node.why


def test_without_two_history_windows_a_job_is_unknown_not_steady() -> None:
    (pace,) = find(features({0: 30.0, 1: 30.0, 2: 30.0}, {3: 10.0}), np.zeros((3, 4)), RULE)
    assert pace.verdict == "unknown" and pace.impact is None
    assert pace.why.startswith("too short to judge against its own history: 1 of the 3 windows")
    zero = find(features({0: 1.0, 1: 1.0, 2: 1.0}, {3: 0.0, 4: 0.0}), np.zeros((3, 4)), RULE)
    assert zero[0].verdict == "unknown"  # steps that say no time: nothing to be slower than
    off = Rule(slowdown=0.0, windows=2, own_history=3, min_samples=3)
    assert find(features({0: 30.0}, {3: 10.0, 4: 10.0}), np.zeros((3, 4)), off) == ()


# --- through the analyzer ----------------------------------------------------------------------


def test_a_job_slowed_on_every_rank_is_its_finding_and_no_node_is_suspect(tmp_path: Path) -> None:
    result = slowed_trace(tmp_path).analyze()
    assert set(verdicts(result).values()) == {"healthy"}  # peers slowed together: no node
    (job,) = result.jobs
    assert (job.job, job.verdict, job.windows) == ("j1", "slowed", 2)
    assert job.nodes == tuple(f"gn{i:02d}" for i in range(1, 7)) and job.ranks == 48
    assert job.baseline_s == pytest.approx(10.0, abs=0.2)  # the slowest compute + 3 s
    assert job.step_s == pytest.approx(13.5, abs=0.2)
    assert job.impact is not None and job.impact["gpus"] == 48
    assert job.impact["s_per_step_lost"] == pytest.approx(3.5, abs=0.2)
    assert result.slowed == [job]
    assert result.to_dict()["jobs"] == [job.to_dict()]


def test_a_job_slowed_by_one_node_stays_that_nodes_matter(tmp_path: Path) -> None:
    tr = Trace(tmp_path, minutes=30)
    tr.slow[tr.at(ONSET) :, tr.node("gn03"), :] = 1.5  # the job's step time rises as much
    result = tr.analyze()
    assert verdicts(result)["gn03"] == "suspect"
    (job,) = result.jobs
    assert job.verdict == "steady" and "that node's matter" in job.why
    assert result.slowed == []


def test_a_job_younger_than_its_baseline_is_unknown(tmp_path: Path) -> None:
    result = slowed_trace(tmp_path, minutes=18).analyze()  # 1 history window before the 3
    (job,) = result.jobs
    assert job.verdict == "unknown" and job.why.startswith("too short to judge")
    off = load_settings(assignments=("analyze.job_slowdown=0",), environ={})
    assert analyze(tmp_path, off).jobs == ()  # not looked for: nothing said of any job


def test_passes_a_minute_apart_give_what_a_cold_pass_gives(tmp_path: Path) -> None:
    """The controller's analyzer, windows on the minute, keeps each history window's rank rows
    rather than its steps: the job's pace comes out as a cold pass over the store gives it."""
    src = slowed_trace(tmp_path / "src").write()
    store = tmp_path / "store"
    replay = Replay(src, store)
    settings = load_settings(environ={})
    grid = Analyzer(settings, store, grid_s=60.0)
    seen = set()
    try:
        for minute in range(14, 31):
            replay.advance(T0 + 60 * minute)
            got = grid.analyze().to_dict()
            want = analyze(store, settings, got["window"]["end"]).to_dict()
            got["input"].pop("records"), want["input"].pop("records")
            assert got == want, minute
            seen |= {j["verdict"] for j in got["jobs"]}
    finally:
        replay.mirror.close()
    assert seen == {"unknown", "steady", "slowed"}


def test_analyze_json_reports_a_simulated_job_wide_slowdown(tmp_path: Path) -> None:
    """The simulator's job-wide slowdown (every rank of one job 1.6x slower at once), judged in
    one-minute windows: the job's finding with its cost, no node suspect or watched."""
    truth = simulate(tmp_path, nodes=32, seed=5, faults="none")
    (slow,) = {i.onset for i in truth.confounders if i.kind == "job_slowdown"}
    nodes = sorted(i.node for i in truth.confounders if i.kind == "job_slowdown")
    at = slow + 150  # 2.5 one-minute windows into it
    out = CliRunner().invoke(
        main, ["analyze", "--input", str(tmp_path), "--window", "60s", "--at", str(at), "--json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["summary"]["suspect"] == data["summary"]["watch"] == 0
    (job,) = [j for j in data["jobs"] if j["verdict"] == "slowed"]
    assert job["nodes"] == nodes and job["windows"] >= 2
    assert job["impact"]["ratio"] > 1.25 and job["impact"]["gpu_h_lost"] > 0
    assert job["impact"]["s_per_step_lost"] == pytest.approx(job["step_s"] - job["baseline_s"])
    assert {j["verdict"] for j in data["jobs"] if j is not job} == {"steady"}
