"""Fabric faults in the telemetry simulator, through the analysis and the classification: a
degraded leaf is named as the leaf with no node finding acted on, one bad cable as that node's
link, and the tree the simulator writes is the one Slurm's topology.conf would give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from guardctl.analyze import analyze_frame, load
from guardctl.cli import main
from guardctl.config import Settings
from guardctl.controller.classify import Classified, classify
from guardctl.errors import UsageError
from guardctl.simulate import parse_faults, simulate
from guardctl.simulate.faults import FABRIC, FAULTS
from guardctl.slurm.parse import topology_from_text
from guardctl.topology import Topology


def judge(out: Path, at: float) -> tuple[Classified, Topology]:
    """The controller's classification at *at*, with the tree read from topology.conf."""
    settings = Settings()
    topology = topology_from_text((out / "topology.conf").read_text())
    assert topology is not None
    analysis = analyze_frame(load(out, settings), settings.analyze, at=at)
    return classify(analysis, settings.control, topology=topology), topology


def test_a_degraded_leaf_is_named_as_the_leaf_and_no_node_is_acted_on(tmp_path: Path) -> None:
    truth = simulate(tmp_path, nodes=32, seed=4, faults="leaf_degraded")
    [fault] = truth.fabric
    assert fault.component.startswith("leaf:") and len(fault.nodes) >= 3
    c, topology = judge(tmp_path, truth.end)
    assert fault.component in [f.component for f in c.fabric]
    assert not [f for f in c.fabric if f.kind != "link"][1:]  # that leaf alone
    assert [f.node for f in c.findings if f.kind == "persistent"] == []
    behind = [f for f in c.findings if f.node in fault.nodes]
    assert behind and {f.kind for f in behind} == {"fabric"}
    # without the tree (as before), the same nodes are node faults the ladder would act on
    plain = classify(
        analyze_frame(load(tmp_path, Settings()), Settings().analyze, at=truth.end),
        Settings().control,
    )
    assert {f.node for f in plain.findings if f.kind == "persistent"} >= set(fault.nodes) & {
        f.node for f in behind
    }
    leaf = fault.component.split(":")[1]
    assert set(topology.switches[leaf].nodes) >= set(fault.nodes)


def test_one_bad_cable_is_named_as_that_nodes_link(tmp_path: Path) -> None:
    truth = simulate(tmp_path, nodes=32, seed=4, faults="bad_cable")
    [fault] = truth.fabric
    node = fault.nodes[0]
    assert fault.component == f"link:{node}"
    c, _ = judge(tmp_path, truth.end)
    assert [f.component for f in c.fabric] == [fault.component]
    assert c.of(node) is not None and c.of(node).kind == "persistent"  # type: ignore[union-attr]


def test_a_congested_spine_group_is_named_once_not_leaf_by_leaf(tmp_path: Path) -> None:
    # 96 nodes: a spine group (16) must be a minority of its jobs' nodes for the transmit-wait
    # detector, which judges a port against its job's ports, to see it at all
    truth = simulate(tmp_path, nodes=96, seed=3, faults="spine_congested")
    [fault] = truth.fabric
    c, _ = judge(tmp_path, truth.end)
    assert [f.component for f in c.fabric if f.kind != "link"] == [fault.component]
    assert [f.node for f in c.findings if f.kind == "persistent"] == []


def test_fabric_faults_are_named_not_drawn_by_all(tmp_path: Path) -> None:
    assert set(parse_faults("all")) == set(FAULTS.names())
    assert parse_faults("spine_congested,all") == {
        "spine_congested": 1,
        **dict.fromkeys(FAULTS.names(), 1),
    }
    assert set(FABRIC.names()) == {
        "leaf_degraded",
        "uplink_flapping",
        "spine_congested",
        "bad_cable",
    }
    with pytest.raises(UsageError, match="no leaf left"):
        simulate(tmp_path, nodes=16, seed=1, faults="leaf_degraded:3", dry_run=True)
    with pytest.raises(UsageError, match="not a busy leaf"):
        simulate(tmp_path, nodes=16, seed=1, faults="leaf_degraded@leaf09", dry_run=True)


def test_fabric_faults_leave_the_node_faults_of_a_seed_where_they_were(tmp_path: Path) -> None:
    # placed after the node faults and the confounders: the same seed draws the same ones
    a = simulate(tmp_path / "a", nodes=16, duration=300, seed=5, faults="all:1")
    b = simulate(tmp_path / "b", nodes=16, duration=300, seed=5, faults="all:1,bad_cable")
    assert a.faults == b.faults and a.confounders == b.confounders
    assert a.fabric == [] and [f.kind for f in b.fabric] == ["bad_cable"]
    assert b.fabric[0].nodes[0] not in {i.node for i in b.faults}  # its own node
    truth = json.loads((tmp_path / "a" / "truth.json").read_text())
    assert truth["fabric"] == [] and truth["leaf_size"] == 8


def test_cli_pins_a_fabric_fault_and_writes_the_tree(tmp_path: Path) -> None:
    out = tmp_path / "t"
    run = CliRunner().invoke(
        main,
        [
            "simulate",
            "--out",
            str(out),
            "--nodes",
            "24",
            "--duration",
            "10m",
            "--seed",
            "2",
            "--faults",
            "uplink_flapping@leaf02",
            "--leaf-size",
            "6",
            "--json",
        ],
    )
    assert run.exit_code == 0, run.output
    doc = json.loads(run.output)
    assert [f["component"] for f in doc["fabric"]] == ["uplink:leaf02"]
    assert doc["leaf_size"] == 6
    topology = topology_from_text((out / "topology.conf").read_text())
    assert topology is not None and topology.leaves() == ["leaf01", "leaf02", "leaf03", "leaf04"]
    assert topology.path("node0007") == ("leaf02", "spine01", "core")
