"""Fabric localisation by values: each fault shape over a small tree names its component, and a
node fault under a healthy switch names none."""

from __future__ import annotations

from guardctl.analyze.engine import Analysis, Evidence, NodeVerdict
from guardctl.analyze.fabric import PairResult, Symptom, localise, symptoms_of
from guardctl.topology import Switch, Topology

# Two spines of two leaves of four nodes each: s1 s2 under p1, s3 s4 under p2, p1 p2 under core.
LEAVES = {f"s{i}": tuple(f"n{4 * (i - 1) + k}" for k in range(1, 5)) for i in range(1, 5)}
TREE = Topology(
    {
        **{name: Switch(name, nodes) for name, nodes in LEAVES.items()},
        "p1": Switch("p1", (), ("s1", "s2")),
        "p2": Switch("p2", (), ("s3", "s4")),
        "core": Switch("core", (), ("p1", "p2")),
    }
)
EVERY = [n for nodes in LEAVES.values() for n in nodes]


def sick(*nodes: str, signals: tuple[str, ...] = ("xmit_wait",), **kw: bool) -> list[Symptom]:
    return [Symptom(n, frozenset(signals), **kw) for n in nodes]


def healthy(*but: str) -> list[str]:
    return [n for n in EVERY if n not in but]


def names(found: tuple) -> list[str]:
    return [f.component for f in found]


def test_a_leaf_whose_nodes_all_wait_and_other_leaves_do_not_is_the_leaf() -> None:
    found = localise(TREE, sick("n1", "n2", "n3"), healthy("n1", "n2", "n3"))
    assert names(found) == ["leaf:s1"]
    leaf = found[0]
    assert leaf.kind == "leaf" and leaf.nodes == LEAVES["s1"]
    assert any("3 of 4" in line for line in leaf.evidence_for)
    assert any("n4" in line for line in leaf.evidence_against)  # its healthy peer
    assert "pairwise sweep of n1" in leaf.settle and "another leaf" in leaf.settle
    assert 0 < leaf.confidence < 1


def test_comm_time_alone_points_at_the_leaf_too() -> None:
    found = localise(TREE, sick("n5", "n6", "n7", "n8", signals=("comm",)), healthy(*LEAVES["s2"]))
    assert names(found) == ["leaf:s2"]


def test_one_node_with_port_errors_and_healthy_leaf_peers_is_its_link() -> None:
    found = localise(TREE, sick("n3", signals=("link_errors", "link_rate")), healthy("n3"))
    assert names(found) == ["link:n3"]
    link = found[0]
    assert link.kind == "link" and link.nodes == ("n3",)
    assert any("3 leaf peers on s1 judged healthy" in line for line in link.evidence_for)
    assert "n3" in link.settle and "cable" in link.settle


def test_a_node_fault_under_a_healthy_switch_names_no_component() -> None:
    # slow in busy time (its GPUs), or slow only in comm time, with every peer healthy
    assert localise(TREE, sick("n3", signals=("busy_time", "thermal")), healthy("n3")) == ()
    assert localise(TREE, sick("n3", signals=("comm",)), healthy("n3")) == ()
    # a node waiting and slow in busy time too is not called a link on the wait alone
    assert localise(TREE, sick("n3", signals=("xmit_wait", "busy_time")), healthy("n3")) == ()


def test_two_nodes_with_port_errors_on_one_leaf_are_two_links_not_the_leaf() -> None:
    found = localise(TREE, sick("n1", "n2", signals=("link_errors",)), healthy("n1", "n2"))
    assert names(found) == ["link:n1", "link:n2"]


def test_symptoms_on_every_leaf_under_one_spine_are_that_spine_group() -> None:
    under = [*LEAVES["s3"][:3], *LEAVES["s4"][1:]]
    found = localise(TREE, sick(*under), healthy(*under))
    assert names(found) == ["spine:p2"]
    assert set(found[0].nodes) == set(LEAVES["s3"] + LEAVES["s4"])


def test_every_leaf_sick_is_no_switch_of_ours() -> None:
    # the whole fabric at once: the fleet-wide rule's, not a switch's (the core is never named)
    assert localise(TREE, sick(*EVERY), []) == ()


def test_a_racks_stand_in_names_no_spine() -> None:
    racks = Topology.from_groups({"r1": LEAVES["s1"], "r2": LEAVES["s2"]}, "racks")
    found = localise(racks, sick(*LEAVES["s1"]), list(LEAVES["s2"]))
    assert names(found) == ["leaf:r1"]


def test_pairwise_results_split_the_leaf_from_its_uplinks() -> None:
    nodes, judged = sick("n1", "n2", "n3"), healthy("n1", "n2", "n3")
    inside_fine = [PairResult("n1", "n2", False), PairResult("n1", "n9", True)]
    found = localise(TREE, nodes, judged, inside_fine)
    assert names(found) == ["uplink:s1"]
    assert any("inside the leaf: 0 of 1" in line for line in found[0].evidence_for)
    inside_slow = [PairResult("n1", "n2", True), PairResult("n1", "n9", True)]
    assert names(localise(TREE, nodes, judged, inside_slow)) == ["leaf:s1"]
    # agreeing results make it surer than none
    assert localise(TREE, nodes, judged, inside_slow)[0].confidence > (
        localise(TREE, nodes, judged)[0].confidence
    )


def test_symptoms_that_came_and_went_together_are_a_flapping_uplink() -> None:
    # each node too briefly flagged to be persistent, but the leaf's nodes together
    passing = sick("n1", "n2", "n3", current=False, persistent=False)
    assert names(localise(TREE, passing, healthy("n1", "n2", "n3"))) == ["uplink:s1"]
    # still there now and not persistent: too early to name anything
    early = sick("n1", "n2", "n3", persistent=False)
    assert localise(TREE, early, healthy("n1", "n2", "n3")) == ()


def test_a_healthy_pairwise_result_weakens_a_link() -> None:
    nodes, judged = sick("n3", signals=("link_errors",)), healthy("n3")
    alone = localise(TREE, nodes, judged)[0]
    fine = localise(TREE, nodes, judged, [PairResult("n3", "n4", False)])[0]
    assert fine.confidence < alone.confidence
    assert any("pairwise" in line for line in fine.evidence_against)


def test_a_bad_cable_under_a_bad_leaf_is_still_named() -> None:
    nodes = [*sick("n1", "n2"), *sick("n3", signals=("xmit_wait", "link_flaps"))]
    assert sorted(names(localise(TREE, nodes, ["n4", *LEAVES["s2"]]))) == ["leaf:s1", "link:n3"]


def test_nodes_outside_the_tree_are_left_out() -> None:
    assert localise(TREE, sick("x1", "x2", "x3"), healthy()) == ()


def test_symptoms_of_an_analysis() -> None:
    end = 1_800_000_000.0

    def ev(detector: str, at: float) -> Evidence:
        return Evidence(detector, "m", "u", 2.0, 1.0, 1.0, 2.0, at - 300, at)

    a = Analysis(
        end - 300,
        end,
        (
            NodeVerdict("n1", "suspect", 2.0, evidence=(ev("xmit_wait", end),), job="j"),
            NodeVerdict("n2", "watch", 1.0, evidence=(ev("xmit_wait", end - 300),), job="j"),
            NodeVerdict("n3", "healthy", 0.0, job="j"),
            NodeVerdict("n4", "healthy", 0.0, job="alone"),  # a one-node job: no fabric traffic
            NodeVerdict("n5", "healthy", 0.0),  # idle
        ),
    )
    symptoms, judged = symptoms_of(a)
    assert [(s.node, s.current, s.persistent) for s in symptoms] == [
        ("n1", True, True),
        ("n2", False, False),
    ]
    assert judged == ["n3"]
