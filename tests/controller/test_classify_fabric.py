"""Classification with the network tree, by values: nodes behind a switch at fault are kind
``fabric`` (never a node action), a node fault under a healthy switch stays a node fault, a bad
cable's node stays on the node ladder, and the tree's leaves serve as racks."""

from __future__ import annotations

import dataclasses

from test_policy import CFG, NOW, ev

from guardctl.analyze.engine import Analysis, NodeVerdict
from guardctl.analyze.fabric import PairResult
from guardctl.controller.classify import classify
from guardctl.topology import Switch, Topology

# leaf s1: n1-n4, leaf s2: n5-n8, leaf s3: n9-n12; s1 s2 under p1, s3 under p2
TREE = Topology(
    {
        "s1": Switch("s1", ("n1", "n2", "n3", "n4")),
        "s2": Switch("s2", ("n5", "n6", "n7", "n8")),
        "s3": Switch("s3", ("n9", "n10", "n11", "n12")),
        "p1": Switch("p1", (), ("s1", "s2")),
        "p2": Switch("p2", (), ("s3",)),
        "core": Switch("core", (), ("p1", "p2")),
    }
)


def node(name: str, *detectors: str, job: str = "j1") -> NodeVerdict:
    return NodeVerdict(
        name,
        "suspect" if detectors else "healthy",
        2.0 if detectors else 0.0,
        evidence=tuple(ev(d) for d in detectors),
        flagged_windows=3 if detectors else 0,
        job=job,
    )


def fleet(**flagged: tuple[str, ...]) -> Analysis:
    """Twelve nodes of one job; *flagged*: node -> its detectors."""
    return Analysis(
        NOW - 300,
        NOW,
        tuple(node(f"n{i}", *flagged.get(f"n{i}", ())) for i in range(1, 13)),
    )


def kinds(c: object) -> dict[str, str]:
    return {f.node: f.kind for f in c.findings}  # type: ignore[attr-defined]


def test_a_degraded_leaf_is_a_fabric_finding_and_no_node_fault() -> None:
    a = fleet(n1=("xmit_wait",), n2=("xmit_wait",), n3=("xmit_wait",), n4=("xmit_wait",))
    today = classify(a, CFG)
    assert set(kinds(today).values()) - {"structural"} <= {"persistent"}  # acted on today
    c = classify(a, CFG, topology=TREE)
    assert [f.component for f in c.fabric] == ["leaf:s1"]
    assert kinds(c) == {n: "fabric" for n in ("n1", "n2", "n3", "n4")}
    assert "explained by leaf:s1" in c.of("n1").why  # type: ignore[union-attr]
    assert c.fleet == ()  # the fabric took them: no rack or job finding over them


def test_a_node_fault_under_a_healthy_switch_stays_a_node_fault() -> None:
    a = fleet(n6=("thermal", "busy_time"), n10=("busy_time",))
    c = classify(a, CFG, topology=TREE)
    assert c.fabric == ()
    assert kinds(c) == {"n6": "persistent", "n10": "persistent"}


def test_a_node_fault_on_a_degraded_leaf_stays_a_node_fault() -> None:
    a = fleet(n1=("xmit_wait",), n2=("xmit_wait",), n3=("xmit_wait", "thermal"))
    c = classify(a, CFG, topology=TREE)
    assert [f.component for f in c.fabric] == ["leaf:s1"]
    assert kinds(c) == {"n1": "fabric", "n2": "fabric", "n3": "persistent"}


def test_a_bad_cable_is_named_and_its_node_stays_on_the_node_ladder() -> None:
    c = classify(fleet(n7=("link_errors", "link_rate")), CFG, topology=TREE)
    assert [(f.component, f.nodes) for f in c.fabric] == [("link:n7", ("n7",))]
    assert kinds(c) == {"n7": "persistent"}


def test_without_a_tree_nothing_changes() -> None:
    a = fleet(n1=("xmit_wait",), n2=("xmit_wait",), n3=("xmit_wait",), n4=("xmit_wait",))
    assert classify(a, CFG) == dataclasses.replace(classify(a, CFG, topology=None))
    assert classify(a, CFG).fabric == ()


def test_the_leaves_serve_as_racks_when_none_are_set() -> None:
    # three of s1's nodes slow in busy time (not the network): a common cause in the rack
    a = fleet(n1=("busy_time",), n2=("busy_time",), n3=("busy_time",))
    jobs = {f"n{i}": f"j{i}" for i in range(1, 13)}  # one job each: no job finding over them
    a = dataclasses.replace(
        a, nodes=tuple(dataclasses.replace(v, job=jobs[v.node]) for v in a.nodes)
    )
    assert classify(a, CFG, fleet_size=100).fleet == ()
    c = classify(a, CFG, fleet_size=100, topology=TREE)
    assert [(f.scope, f.name) for f in c.fleet] == [("rack", "s1")]
    assert c.fabric == ()  # busy time is not the network's
    # [control] racks set: they win over the tree's leaves
    set_racks = dataclasses.replace(CFG, racks={"r9": "n1,n2,n3,n5,n6,n7,n8,n9,n10,n11,n12"})
    assert classify(a, set_racks, fleet_size=100, topology=TREE).fleet == ()


def test_pairwise_results_reach_the_localisation() -> None:
    a = fleet(n1=("xmit_wait",), n2=("xmit_wait",), n3=("xmit_wait",))
    pairs = [PairResult("n1", "n2", False), PairResult("n1", "n9", True)]
    c = classify(a, CFG, topology=TREE, pairwise=pairs)
    assert [f.component for f in c.fabric] == ["uplink:s1"]
    assert set(kinds(c).values()) == {"fabric"}


def test_a_node_on_a_leaf_whose_symptoms_are_arriving_is_watched_not_acted_on() -> None:
    # n1 persistent, n2 and n3 flagged once so far: no switch named yet, and not n1's fault
    watching = [dataclasses.replace(node(n, "xmit_wait"), verdict="watch") for n in ("n2", "n3")]
    a = fleet(n1=("xmit_wait",))
    a = dataclasses.replace(a, nodes=(a.nodes[0], *watching, *a.nodes[3:]))
    c = classify(a, CFG, topology=TREE)
    assert c.fabric == ()
    assert c.of("n1").kind == "transient"  # type: ignore[union-attr]
    assert "fabric fault arriving" in c.of("n1").why  # type: ignore[union-attr]
    assert classify(a, CFG).of("n1").kind == "persistent"  # type: ignore[union-attr]
