"""Topology-aware pairing tells a node from its link, its leaf, the leaf's uplink and a spine
group: a simulated fabric (a test is slow when it carries a faulty component), every kind of
fault, and what the sweep engine makes of the outcome (verdicts, partners, lab-only injection)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardctl.config import Layer, build_settings
from guardctl.controller.fabric import open_fabric
from guardctl.controller.sweeps import record_sweep_fabric
from guardctl.errors import ConfigError
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.sweep import engine, fabric, pairing
from guardctl.topology import Switch, Topology


def tree(leaves: int = 4, per_leaf: int = 4, per_spine: int = 2) -> Topology:
    """Leaves s1.. of per_leaf nodes n01.., per_spine leaves under each spine sp1.., one core."""
    switches: dict[str, Switch] = {}
    for i in range(leaves):
        nodes = tuple(f"n{i * per_leaf + j + 1:02d}" for j in range(per_leaf))
        switches[f"s{i + 1}"] = Switch(f"s{i + 1}", nodes)
    spines = []
    for k in range(0, leaves, per_spine):
        name = f"sp{k // per_spine + 1}"
        under = tuple(f"s{j + 1}" for j in range(k, min(leaves, k + per_spine)))
        switches[name] = Switch(name, (), under)
        spines.append(name)
    switches["core"] = Switch("core", (), tuple(spines))
    return Topology(switches)


def fabric_oracle(topology: Topology, faults: set[str]) -> pairing.Oracle:
    def oracle(groups: list[pairing.Group]) -> list[bool | None]:
        return [not (fabric.carried(g, topology) & faults) for g in groups]

    return oracle


def sweep(
    faults: set[str], suspects: list[str], topology: Topology | None = None
) -> pairing.Outcome:
    topo = topology or tree()
    goods = engine.by_leaf([n for n in topo.nodes() if n not in suspects], suspects, topo)
    return pairing.find_bad("regroup", suspects, goods, fabric_oracle(topo, faults), topology=topo)


def test_what_a_test_carries() -> None:
    t = tree()
    assert fabric.carried(("n01", "n02"), t) == {"link:n01", "link:n02", "leaf:s1"}
    across_spine_group = fabric.carried(("n01", "n05"), t)
    assert across_spine_group == {
        "link:n01",
        "link:n05",
        "leaf:s1",
        "leaf:s2",
        "uplink:s1",
        "uplink:s2",
        "spine:sp1",
    }
    far = fabric.carried(("n01", "n09"), t)
    assert {"spine:sp1", "spine:sp2", "spine:core"} <= far


def test_a_slow_leaf_is_the_leaf_not_its_nodes() -> None:
    outcome = sweep({"leaf:s2"}, ["n05", "n06"])
    assert outcome.fabric == {"leaf:s2": {"n05", "n06"}}
    assert not outcome.bad and not outcome.undetermined
    assert outcome.rounds <= 2


def test_a_slow_uplink_clears_the_nodes_that_pass_among_themselves() -> None:
    outcome = sweep({"uplink:s2"}, ["n05", "n06"])
    assert set(outcome.fabric) == {"uplink:s2"}
    assert outcome.cleared == {"n05", "n06"} and not outcome.bad
    assert outcome.rounds <= 2


def test_a_bad_cable_is_still_its_node() -> None:
    outcome = sweep({"link:n05"}, ["n05", "n06"])
    assert outcome.bad == {"n05"} and outcome.cleared == {"n06"}
    assert outcome.fabric == {}
    assert outcome.rounds == 1


def test_a_slow_spine_group() -> None:
    outcome = sweep({"spine:sp1"}, ["n01", "n05"])
    assert set(outcome.fabric) == {"spine:sp1"}
    assert not outcome.bad


def test_a_slow_leaf_with_a_lone_suspect() -> None:
    outcome = sweep({"leaf:s2"}, ["n05"])
    assert outcome.fabric == {"leaf:s2": {"n05"}} and not outcome.bad


def test_without_a_tree_pairing_is_as_before() -> None:
    oracle = pairing.simulated_oracle({"s0003"})
    suspects = [f"s{i:04d}" for i in range(8)]
    outcome = pairing.find_bad("regroup", suspects, ["g1", "g2"], oracle)
    assert outcome.bad == {"s0003"} and not outcome.fabric_aware


def test_a_tree_of_one_leaf_pairs_as_before() -> None:
    one = Topology({"s1": Switch("s1", ("a", "b", "c"))})
    outcome = pairing.find_bad(
        "regroup", ["a", "b"], ["c"], pairing.simulated_oracle({"a"}), topology=one
    )
    assert outcome.bad == {"a"} and not outcome.fabric_aware


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["link", "leaf", "uplink", "spine"]),
    index=st.integers(min_value=0, max_value=15),
    extra=st.integers(min_value=0, max_value=15),
)
def test_any_single_fault_is_localised(kind: str, index: int, extra: int) -> None:
    t = tree()
    nodes = t.nodes()
    node = nodes[index]
    leaf = t.leaf_of(node) or ""
    fault = {
        "link": f"link:{node}",
        "leaf": f"leaf:{leaf}",
        "uplink": f"uplink:{leaf}",
        "spine": f"spine:{t.parent_of(leaf)}",
    }[kind]
    suspects = sorted({node, nodes[extra]})
    outcome = sweep({fault}, suspects, t)
    for r in outcome.history:
        members = [n for group, _ in r for n in group]
        assert len(members) == len(set(members))
    if kind == "link":
        assert outcome.bad == {node} and not outcome.fabric
    else:
        assert set(outcome.fabric) == {fault} and not outcome.bad
    assert not outcome.undetermined
    assert outcome.rounds <= 4


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_judge_that_misses_no_slow_test_drains_no_healthy_node(data: st.DataObject) -> None:
    t = tree()
    nodes = t.nodes()
    suspects = sorted(set(data.draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3))))
    goods = engine.by_leaf([n for n in nodes if n not in suspects], suspects, t)
    pairs = [(a, b) for a in nodes for b in nodes if a < b]
    components = sorted({c for pair in pairs for c in fabric.carried(pair, t)})
    # One or two faults anywhere but in a known-good partner's link (known good by premise).
    faulty = [c for c in components if not (c.startswith("link:") and c[5:] in goods)]
    faults = set(data.draw(st.lists(st.sampled_from(faulty), min_size=1, max_size=2)))
    outcome = pairing.find_bad("regroup", suspects, goods, fabric_oracle(t, faults), topology=t)
    assert {f"link:{n}" for n in outcome.bad} <= faults, (faults, outcome.bad)


def test_partners_by_leaf_and_the_reference_group_away_from_the_suspects() -> None:
    t = tree()
    idle = [n for n in t.nodes() if n not in ("n05", "n06")]
    goods = engine.by_leaf(idle, ["n05", "n06"], t)
    # One on the suspects' leaf, then one per other leaf, nearest first; then a second each.
    assert goods == ["n07", "n01", "n09", "n13", "n08", "n02", "n10", "n14"]
    assert engine.reference_group(goods, ["n05", "n06"], 1, t) == ("n01", "n02")
    assert engine.reference_group(["n07", "n08"], ["n05"], 1, t) == ("n07", "n08")


def test_lab_injection_of_a_fabric_component_reaches_the_jobs_through_it() -> None:
    t = tree()
    leaf = {"leaf:s2": 0.1}
    assert engine.injected_factors(leaf, ("n05", "n01"), t) == {"n05": 0.1}
    # One rank slowed slows the whole all-reduce: the first node beneath the leaf.
    assert engine.injected_factors(leaf, ("n06", "n05"), t) == {"n06": 0.1}
    assert engine.injected_factors(leaf, ("n01", "n02"), t) == {}
    assert engine.injected_factors(leaf, ("n05",), t) == {}  # GEMM: not the network
    uplink = {"uplink:s2": 0.1}
    assert engine.injected_factors(uplink, ("n05", "n06"), t) == {}
    assert engine.injected_factors(uplink, ("n05", "n01"), t) == {"n05": 0.1}
    node = {"n05": 0.5, "leaf:s2": 0.1}
    assert engine.injected_factors(node, ("n05",), t) == {"n05": 0.5}
    assert engine.injected_factors(node, ("n05", "n01"), t) == {"n05": 0.1}
    assert engine.injected_factors(node, ("n05", "n01"), None) == {"n05": 0.5}


def test_the_verdicts_drain_no_node_behind_a_fabric_fault() -> None:
    t = tree()
    outcome = sweep({"leaf:s2"}, ["n05", "n06"], t)
    verdicts = {v.node: v for v in engine._verdicts(["n05", "n06"], [], outcome)}
    assert {n: v.verdict for n, v in verdicts.items()} == {"n05": "fabric", "n06": "fabric"}
    assert "leaf:s2" in verdicts["n05"].evidence
    (finding,) = engine.fabric_findings(outcome, t, ["n07", "n08"])
    assert finding.component == "leaf:s2" and finding.kind == "leaf"
    assert finding.nodes == ("n05", "n06", "n07", "n08")
    assert any("slow" in line for line in finding.evidence_for)
    assert 0 < finding.confidence <= 1 and "s2" in finding.settle


def test_the_controller_notes_the_component_once(tmp_path: Path) -> None:
    table = {"store": {"root": str(tmp_path / "store")}}
    ops = NodeOps(build_settings([Layer("test", table)]), MemorySlurm(tree().nodes()))
    t = tree()
    outcome = sweep({"leaf:s2"}, ["n05"], t)
    report = engine.SweepReport("sw1", "multi", ["n05"], False, 0.0)
    report.fabric = [f.as_dict() for f in engine.fabric_findings(outcome, t, [])]
    assert record_sweep_fabric(ops, report) == ["leaf:s2"]
    assert record_sweep_fabric(ops, report) == []  # open already, same nodes
    entry = open_fabric(ops.log.entries())["leaf:s2"]
    assert entry.evidence["source"] == "sweep" and entry.evidence["sweep"] == "sw1"
    assert sorted(entry.nodes) == ["n05", "n06", "n07", "n08"]
    assert not any(s.drained for s in ops.slurm.nodes())


@pytest.mark.parametrize("bad", ["leaf:", "switch:s1", ":s1"])
def test_an_injected_component_must_be_a_component(bad: str) -> None:
    with pytest.raises(ConfigError, match="invalid fabric component"):
        build_settings([Layer("test", {"sweep": {"inject": {bad: 0.5}}})])
    ok = build_settings([Layer("test", {"sweep": {"inject": {"leaf:s2": 0.5}}})])
    assert ok.sweep.inject == {"leaf:s2": 0.5}
