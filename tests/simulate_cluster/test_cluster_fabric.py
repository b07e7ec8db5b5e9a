"""The fleet simulation's network tree and fabric faults: today's node-only controller against
the same controller told the tree, on the same faults."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from guardctl.actionlog import ActionLog
from guardctl.analyze.engine import Analysis
from guardctl.cli import main
from guardctl.controller.classify import Classified
from guardctl.sections.control import ControlSettings
from guardctl.simulate.cluster import fabric, faults, policies
from guardctl.simulate.cluster.engine import Cluster
from guardctl.simulate.cluster.metrics import Tally
from guardctl.simulate.cluster.params import HOUR, Params
from guardctl.simulate.cluster.run import compare_fabric, control_settings, safety_settings

# 128 nodes under 16 leaves of 8 (two spine groups): the large jobs take 25 nodes, so one
# leaf is a third of a job (under the job's structural fraction), and the batch partition's
# small jobs come and go on the first leaves. No drawn fault: each test places its own.
TREE = dataclasses.replace(
    Params(nodes=128, days=0.5, seed=3, leaf_nodes=8).fault_free(),
    contention_per_node_day=0.0,
    stall_per_job_hour=0.0,
    imbalance_share=0.0,
    false_positive_per_node_pass=0.0,
)
NODE_ONLY, FABRIC_AWARE = "guardctl", policies.FABRIC


def run(policy: str, extra: list[faults.Onset], store: Path | None = None) -> tuple[Cluster, Tally]:
    """*policy* on TREE with the faults *extra* (its action log kept under *store*)."""
    cfg, safety = control_settings(TREE), safety_settings(TREE)
    if store is not None:
        chosen: policies.Policy = policies.Guardctl(cfg, safety, store, policy == FABRIC_AWARE)
    else:
        chosen = policies.make(policy, cfg, safety)
    sim = Cluster(TREE, chosen, extra=extra)
    return sim, sim.run()


def by_guardctl(sim: Cluster) -> set[str]:
    return {n for n, who in sim.drained.items() if who == "guardctl"}


def degraded(leaf: int) -> list[faults.Onset]:
    """Leaf *leaf* (0-based) degraded 1.25x from the first hour for six hours."""
    return [faults.Onset(HOUR, -1, "leaf", 1.25, 6 * HOUR, faults.SWITCH_DETECTORS, leaf)]


def test_the_tree_names_its_switches_as_the_records_do() -> None:
    sim = Cluster(TREE, policies.make("none"))
    topo = sim.topology
    assert topo.leaves() == [f"leaf{i:02d}" for i in range(1, 17)]
    assert topo.leaf_of("node00009") == "leaf02" and topo.path("node00009") == (
        "leaf02",
        "spine01",
        "core",
    )
    assert len(topo.nodes_under("spine02")) == 64 and topo.nodes() == tuple(sim.names)
    assert fabric.component_of("uplink", 1) == "uplink:leaf02"
    assert fabric.component_of("spine", 0) == "spine:spine01"


def test_fabric_faults_leave_the_node_faults_as_they_were() -> None:
    week = Params(nodes=2000, days=7.0)
    plain = faults.draw(week, np.random.default_rng([0, 1]))
    both = faults.draw(dataclasses.replace(week, fabric=True), np.random.default_rng([0, 1]))
    switch_or_cable = {*fabric.SWITCH_FAULTS, fabric.CABLE}
    assert not any(o.kind in switch_or_cable for o in plain.onsets)
    assert [o for o in both.onsets if o.kind not in switch_or_cable] == plain.onsets
    kinds = Counter(o.kind for o in both.onsets if o.kind in switch_or_cable)
    # Every kind comes a few times a week at 2000 nodes (uplink: each flap of an episode).
    assert set(kinds) == switch_or_cable and all(n >= 2 for n in kinds.values()), kinds
    assert (
        dataclasses.replace(week, fabric=True).fault_free().scaled(1.0).cable_per_1000_node_days
        == 0
    )


def test_a_degraded_leaf_costs_todays_controller_healthy_nodes_not_the_fabric_aware_one() -> None:
    # The sixth leaf: a third of one large job's nodes.
    leaf = fabric.leaf_name(5)
    nodes = set(Cluster(TREE, policies.make("none")).topology.nodes_under(leaf))
    sim, today = run(NODE_ONLY, degraded(5))
    assert today.false_quarantines >= len(nodes) // 2 and sim.quarantined <= nodes
    assert today.healthy_held_gpu_h > 0 and not today.named
    sim, aware = run(FABRIC_AWARE, degraded(5))
    assert (aware.quarantines, aware.drains, aware.sweeps) == (0, 0, 0)
    assert aware.healthy_held_gpu_h == 0 and not by_guardctl(sim)
    assert aware.named == {f"leaf:{leaf}"} and not aware.misnamed
    assert len(aware.localise_s) == 1 and aware.localise_s[0] <= HOUR


def test_a_degraded_leaf_of_small_jobs_gets_todays_controller_to_drain_a_healthy_node(
    tmp_path: Path,
) -> None:
    # The second leaf: the batch partition's, its nodes swept whenever their small jobs end;
    # a pairwise sweep without the tree fails a node whose leaf is degraded.
    sim, today = run(NODE_ONLY, degraded(1), tmp_path / "today")
    assert today.false_drains >= 1 and by_guardctl(sim) <= set(sim.topology.nodes_under("leaf02"))
    swept = [e for e in ActionLog(tmp_path / "today").entries() if e.action == "control sweep"]
    assert "fail" in {e.evidence["verdict"] for e in swept}
    # Told the tree, it names the leaf once two of its nodes show it (before that a lone node's
    # transmit wait reads as its own link: quarantined and swept), and its sweeps' partners,
    # chosen by the tree, blame the leaf: no drain.
    sim, aware = run(FABRIC_AWARE, degraded(1), tmp_path / "aware")
    assert aware.drains == 0 and not by_guardctl(sim)
    assert "leaf:leaf02" in aware.named
    swept = [e for e in ActionLog(tmp_path / "aware").entries() if e.action == "control sweep"]
    verdicts = {e.evidence["verdict"] for e in swept}
    assert "fabric" in verdicts and verdicts <= {"fabric", "pass"}


def test_a_single_bad_cable_is_treated_on_its_node_by_both() -> None:
    node = "node00011"  # a batch node: its small jobs end, so that it is swept
    cable = [faults.Onset(HOUR, 10, "cable", 1.25, 0.0, faults.CABLE_DETECTORS)]
    for policy in (NODE_ONLY, FABRIC_AWARE):
        sim, tally = run(policy, cable)
        assert by_guardctl(sim) == {node} and tally.false_drains == 0, policy
    assert tally.named == {f"link:{node}"} and not tally.misnamed


def test_a_node_fault_under_a_healthy_leaf_is_drained_by_both() -> None:
    grey = [faults.Onset(HOUR, 10, "grey", 1.25)]  # burn-in reveals it at once (no reveal time)
    for policy in (NODE_ONLY, FABRIC_AWARE):
        sim, tally = run(policy, grey)
        assert by_guardctl(sim) == {"node00011"} and tally.false_drains == 0, policy
        assert not tally.named and not tally.misnamed


def test_the_comparison_runs_both_controllers_on_the_same_faults() -> None:
    small = Params(nodes=64, days=0.25, leaf_nodes=8)
    result = compare_fabric(small, [0])
    assert result["fabric"] and list(result["policies"]) == [NODE_ONLY, FABRIC_AWARE]
    for data in result["policies"].values():
        row = data["runs"][0]
        assert {"gpu_h_lost_to_fabric", "false_quarantines", "localised", "misnamed"} <= set(row)
    res = CliRunner().invoke(
        main,
        ["simulate", "cluster", "--nodes", "64", "--days", "0.25", "--fabric", "--quiet"],
    )
    assert res.exit_code == 0, res.output
    assert "healthy nodes quarantined" in res.output and "| guardctl-fabric |" in res.output
    res = CliRunner().invoke(
        main,
        ["simulate", "cluster", "--nodes", "64", "--days", "0.25", "--fabric", "--json", "--quiet"],
    )
    assert json.loads(res.output)["params"]["fabric"] is True
    res = CliRunner().invoke(main, ["simulate", "cluster", "--fabric", "--sensitivity", "--quiet"])
    assert res.exit_code == 2 and "not both" in res.output


def test_todays_controller_is_not_told_the_tree_and_the_fabric_aware_one_records_the_leaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, frozenset[str]]] = []
    real = policies.classify

    def spy(analysis: Analysis, cfg: ControlSettings, *args: Any, **kw: Any) -> Classified:
        calls.append((len(args), frozenset(kw)))
        return real(analysis, cfg, *args, **kw)

    monkeypatch.setattr(policies, "classify", spy)
    logs = {}
    for topology in (False, True):
        store = tmp_path / str(topology)
        policy = policies.Guardctl(control_settings(TREE), safety_settings(TREE), store, topology)
        Cluster(TREE, policy, extra=degraded(5)).run()
        logs[topology] = [e for e in ActionLog(store).entries() if e.action == "control fabric"]
        # today's call, exactly: the analysis and the settings, nothing more
        assert set(calls) == ({(0, frozenset({"topology"}))} if topology else {(0, frozenset())})
        calls.clear()
    assert logs[False] == []
    opened = [e for e in logs[True] if e.evidence.get("phase") == "open"]
    assert opened and {e.evidence["component"] for e in opened} == {"leaf:leaf06"}
    assert [
        e.evidence["component"] for e in logs[True] if e.evidence.get("phase") == "cleared"
    ] == ["leaf:leaf06"]


def test_a_job_starting_up_is_not_judged_healthy() -> None:
    # No step measured yet: its nodes' traffic says nothing for or against their switches.
    policy = policies.Guardctl(control_settings(TREE), safety_settings(TREE))
    sim = Cluster(TREE, policy)
    job = next(j for j in sim.jobs.values() if j.large and j.running)
    for at, verdict in ((job.ready - 1, "unknown"), (job.ready, "healthy")):
        sim.now = at
        verdicts = {v.node: v.verdict for v in policy.analysis(sim, []).nodes}
        assert {verdicts[n] for n in job.nodes} == {verdict}


def test_less_work_hides_a_slow_gpu_not_a_slow_switch() -> None:
    sim = Cluster(TREE, policies.make("none"))
    job = next(j for j in sim.jobs.values() if j.large and j.running)
    node, leaf = job.nodes[3], sim.topology.leaf_of(job.nodes[3])
    index = sim.topology.leaves().index(leaf or "")
    sim.now = job.ready + 10
    sim._on_onset(faults.Onset(0.0, -1, "leaf", 1.25, HOUR, faults.SWITCH_DETECTORS, index))
    assert job.factor == pytest.approx(1.25)
    sim.rebalance(job, node)  # the data-sharding service gives the node less work: no help
    assert job.factor == pytest.approx(1.25)
    sim._on_onset(faults.Onset(0.0, sim.names.index(node), "grey", 1.5))
    assert 1.25 <= job.factor < 1.3  # its grey GPU's excess hidden, its leaf's not
