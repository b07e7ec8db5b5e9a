"""The cluster simulation: deterministic, exact when calm, driven by the real controller."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from guardctl.actionlog import ActionLog, Entry
from guardctl.analyze.engine import Analysis
from guardctl.cli import main
from guardctl.controller import classify
from guardctl.controller import policy as control
from guardctl.nodeops.ownership import NODE_ACTIONS
from guardctl.sections.control import ControlSettings
from guardctl.simulate.cluster import policies
from guardctl.simulate.cluster.engine import Cluster
from guardctl.simulate.cluster.metrics import Tally
from guardctl.simulate.cluster.params import Params
from guardctl.simulate.cluster.run import compare, control_settings, safety_settings, simulate
from guardctl.slurm.memory import EPOCH as GREY_START

SMALL = Params(nodes=64, days=0.5, seed=3)
QUIET = dataclasses.replace(
    SMALL.fault_free(), contention_per_node_day=0.0, stall_per_job_hour=0.0, imbalance_share=0.0
)


def figures(p: Params, policy: str, **control: object) -> dict[str, object]:
    base = simulate(p.fault_free(), "none").useful_gpu_h
    return simulate(p, policy, control_settings(p, **control)).figures(base)


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    assert figures(SMALL, "guardctl") == figures(SMALL, "guardctl")
    assert figures(SMALL, "none") != figures(dataclasses.replace(SMALL, seed=4), "none")


def test_a_calm_cluster_has_goodput_one_and_no_variation() -> None:
    result = compare(SMALL.calm(), [0, 1])
    for data in result["policies"].values():
        assert data["mean"]["goodput"] == 1.0
        assert data["mean"]["step_time_variation"] == 0.0
        assert data["mean"]["gpu_h_lost"] == 0.0 and data["mean"]["drains"] == 0


def test_a_grey_node_slows_its_job_to_its_factor_and_rebalancing_wins_it_back() -> None:
    sim = Cluster(SMALL.calm(), policies.make("none"))
    job = next(j for j in sim.jobs.values() if j.large and j.running)
    node = job.nodes[3]
    sim.now = job.ready + 10
    sim.grey[node] = 1.25
    sim.set_factor(node)
    assert job.factor == pytest.approx(1.25)  # synchronous: the slowest node's pace
    sim.now += 100
    sim.rebalance(job, node)
    n = len(job.nodes)
    assert job.factor == pytest.approx(n / (n - 1 + 1 / 1.25))
    before = job.done_s
    sim.now += 1000
    job.advance(sim.now)
    assert job.done_s - before == pytest.approx(1000 / job.factor)


def test_the_failstop_policy_never_sees_a_grey_node() -> None:
    grey = dataclasses.replace(QUIET, grey_share=0.1)
    tally = simulate(grey, "failstop")
    assert tally.quarantines == 0 and tally.drains == 0 and tally.variation > 0.05
    assert simulate(grey, "guardctl").variation < tally.variation / 2


def test_confounders_cost_guardctl_no_node_but_fool_the_stage_blind_baseline() -> None:
    noisy = dataclasses.replace(
        SMALL.fault_free(),
        contention_per_node_day=20.0,
        contention_mean_s=1200.0,
        imbalance_share=1.0,
        false_positive_per_node_pass=0.0,
    )
    mine = simulate(noisy, "guardctl")
    assert (mine.quarantines, mine.drains, mine.requeues) == (0, 0, 0)
    guard = simulate(noisy, "guard")
    assert guard.quarantines > 0 and guard.false_drains == 0


def test_lemon_drains_follow_the_controllers_relapses_setting() -> None:
    # Mostly small jobs, so that quarantined lemons come free and are swept; slow an hour at a
    # time, so that many a sweep passes them.
    lemons = dataclasses.replace(
        QUIET,
        days=2.0,
        train_share=0.25,
        lemon_share=0.15,
        lemon_on_mean_s=3600.0,
        lemon_off_mean_s=7200.0,
        max_out_fraction=0.5,
    )
    eager = simulate(lemons, "guardctl", control_settings(lemons, relapses=1))
    patient = simulate(lemons, "guardctl", control_settings(lemons, relapses=50))
    assert eager.lemon_drains > 0 == patient.lemon_drains and eager.sweeps < patient.sweeps
    assert eager.false_drains == patient.false_drains == 0


def test_without_the_controllers_decisions_guardctl_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grey = dataclasses.replace(QUIET, grey_share=0.1)
    assert simulate(grey, "guardctl").quarantines > 0
    monkeypatch.setattr(control, "decide", lambda view, cfg: [])
    tally = simulate(grey, "guardctl")
    assert tally.quarantines == 0 and tally.drains == 0


def test_cli_json_report_and_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(
        main,
        [
            "simulate",
            "cluster",
            "--nodes",
            "32",
            "--days",
            "0.25",
            "--policy",
            "none",
            "--policy",
            "guardctl",
            "--json",
            "--quiet",
            "--report",
            str(tmp_path / "rep"),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert list(data["policies"]) == ["none", "guardctl"] and data["seeds"] == [0]
    mean = data["policies"]["guardctl"]["mean"]
    assert 0 < mean["goodput"] <= 1.0 and not math.isnan(mean["step_time_variation"])
    assert {"table.md", "goodput.png"} <= {p.name for p in (tmp_path / "rep").iterdir()}
    for args, words in (
        (["--gpus", "12"], "multiple of 8"),
        (["--nodes", "3"], "at least 8"),
        (["--nodes", "8", "--gpus", "64"], "not both"),
        (["--relapses", "0"], "relapses"),
        (["--policy", "magic"], "magic"),
    ):
        res = runner.invoke(main, ["simulate", "cluster", "--quiet", *args])
        assert res.exit_code == 2 and words in res.output, res.output
    res = runner.invoke(main, ["simulate"])
    assert res.exit_code == 2 and "--out DIR is required" in res.output


def test_the_benchmark_runs_and_reports_what_the_docs_quote() -> None:
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(repo / "bench" / "simulate_cluster.py"), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert [r["nodes"] for r in result["rows"]] == [125, 250]
    for row in result["rows"]:  # faults and the controller cost more than the calm cluster
        assert row["ratio"] > 1 and row["us_per_node_day"] > 0
        assert row["fabric_s"] > 0 and row["fabric_ratio"] > 0
    assert result["compare_all_s"] > 0 and result["per_node_day_ratio"] > 0


def run_logged(p: Params, store: Path, **control: object) -> tuple[Tally, list[Entry]]:
    """guardctl on *p*, its store kept under *store*: the tally and the run's action log."""
    policy = policies.Guardctl(control_settings(p, **control), safety_settings(p), store)
    tally = Cluster(p, policy).run()
    return tally, ActionLog(store).entries()


def most_held(entries: list[Entry]) -> int:
    """The most nodes guardctl held out at once (quarantined or drained), from its log."""
    held: set[str] = set()
    most = 0
    for e in entries:
        if e.phase == "done" and e.action in ("quarantine", "drain"):
            held |= set(e.nodes)
        elif e.phase == "done" and e.action == "release" and e.evidence.get("because") is None:
            held -= set(e.nodes)
        most = max(most, len(held))
    return most


GREY = dataclasses.replace(QUIET, grey_share=0.1, false_positive_per_node_pass=0.0)


def test_guardctls_actions_go_through_the_door_whose_cap_bites(tmp_path: Path) -> None:
    free, free_log = run_logged(GREY, tmp_path / "free")
    capped, capped_log = run_logged(dataclasses.replace(GREY, max_out_nodes=1), tmp_path / "capped")
    # Half a day: nothing guardctl drained is back from repair, so the log alone says who is out.
    assert free.refused == 0 and most_held(free_log) > 1
    assert capped.refused > 0 and most_held(capped_log) == 1
    assert capped.quarantines < free.quarantines
    for entries in (free_log, capped_log):
        # Every node action's intent was logged before its outcome, on the simulated clock.
        intents = set()
        for e in entries:
            assert GREY_START <= e.ts <= GREY_START + GREY.horizon_s
            if e.phase == "intent":
                intents.add(e.id)
            elif e.phase == "done":
                assert e.action not in NODE_ACTIONS or e.id in intents


def test_the_doors_rate_limit_bites_on_the_simulated_clock(tmp_path: Path) -> None:
    tally, entries = run_logged(dataclasses.replace(GREY, max_actions_per_hour=2), tmp_path)
    assert tally.refused > 0
    done = [e.ts for e in entries if e.phase == "done" and e.action in NODE_ACTIONS]
    assert len(done) >= 2
    assert all(sum(1 for t in done if s <= t < s + 3600) <= 2 for s in done)


def test_classifys_kinds_decide_what_guardctl_acts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert simulate(GREY, "guardctl").quarantines > 0
    # classify's fleet rule alone (two or more of the fleet flagged at once: a common cause)
    cautious = simulate(GREY, "guardctl", control_settings(GREY, max_fleet_fraction=0.01))
    assert cautious.quarantines < simulate(GREY, "guardctl").quarantines
    # host contention is transient to classify; called persistent, it costs nodes
    noisy = dataclasses.replace(
        QUIET,
        contention_per_node_day=20.0,
        contention_mean_s=1200.0,
        false_positive_per_node_pass=0.0,
    )
    assert simulate(noisy, "guardctl").quarantines == 0
    real = classify.classify

    def hardware(analysis: Analysis, cfg: ControlSettings) -> classify.Classified:
        found = real(analysis, cfg)
        return dataclasses.replace(
            found, findings=tuple(dataclasses.replace(f, kind="persistent") for f in found.findings)
        )

    monkeypatch.setattr(policies, "classify", hardware)
    assert simulate(noisy, "guardctl").quarantines > 0


def test_false_suspects_are_quarantined_swept_and_released() -> None:
    # Mostly small jobs, so that a falsely suspected node comes free and is swept.
    calm = dataclasses.replace(QUIET, train_share=0.25, false_positive_per_node_pass=2e-3)
    for name in ("guard", "guardctl"):
        tally = simulate(calm, name)
        assert tally.quarantines > 0 and tally.sweeps > 0
        assert tally.drains == tally.false_drains  # no node here has a fault
    assert simulate(QUIET, "guardctl").quarantines == 0
