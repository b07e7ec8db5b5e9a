"""The network tree: ``scontrol show topology`` as each release prints it (captured from the lab
by tests/capture_fixtures.py), ``[control] racks`` as the override, and the in-memory Slurm's."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardctl.errors import SlurmUnavailable, UsageError
from guardctl.slurm import parse
from guardctl.slurm.memory import MemorySlurm
from guardctl.topology import Switch, Topology, load_topology

FIXTURES = Path(__file__).parent.parent / "fixtures"
RELEASES = ("22.05", "24.11", "26.05")


def captured(release: str, name: str) -> str:
    return (FIXTURES / f"slurm-{release}" / "topology" / name).read_text()


@pytest.mark.parametrize("release", RELEASES)
def test_a_tree_of_two_spine_groups_as_each_release_prints_it(release: str) -> None:
    # topology.conf: s1 (node1-2) and s2 (node3-4) under s10; s3 (node5-6) under s11; s0 on top.
    assert f" {release}." in captured(release, "version.txt")
    tree = parse.topology_from_text(captured(release, "tree.txt"))
    assert tree is not None and tree.source == "slurm"
    assert tree.leaves() == ["s1", "s2", "s3"]
    assert tree.switches["s1"] == Switch("s1", ("node1", "node2"))
    # A switch above others lists every node beneath it; none hangs from it directly.
    assert tree.switches["s10"] == Switch("s10", (), ("s1", "s2"))
    assert tree.switches["s0"] == Switch("s0", (), ("s10", "s11"))
    assert tree.path("node3") == ("s2", "s10", "s0")
    assert tree.path("node6") == ("s3", "s11", "s0")
    assert tree.nodes_under("s10") == ("node1", "node2", "node3", "node4")
    assert tree.nodes() == tuple(f"node{i}" for i in range(1, 7))


@pytest.mark.parametrize("release", RELEASES)
def test_no_topology_plugin_is_no_tree(release: str) -> None:
    # 22.05 says so on stderr, 24.11 and 26.05 print nothing; neither is an error.
    assert parse.topology_from_text(captured(release, "none.txt")) is None
    said = captured(release, "none.stderr.txt").lower()
    assert parse.NO_TOPOLOGY in said if release == "22.05" else not said.strip()


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_topology_block_gives_one_leaf_per_block(release: str) -> None:
    # BlockName=b1 node[1-2], b2 node[3-4], BlockSizes=2,4: one aggregation b[1-2] over both.
    tree = parse.topology_from_text(captured(release, "block.txt"))
    assert tree is not None
    assert tree.leaves() == ["b1", "b2"]
    assert tree.switches["b1"].nodes == ("node1", "node2")
    assert tree.path("node4") == ("b2", "b[1-2]", "fabric")


def test_no_json_form_on_any_release() -> None:
    # Recorded by the capture: 22.05 refuses --json, 24.11 and 26.05 print the text form.
    assert "unrecognized option" in captured("22.05", "unsupported.txt")
    for release in ("24.11", "26.05"):
        assert "prints the text form" in captured(release, "unsupported.txt")


def test_blocks_nest_by_size_and_unaggregated_blocks_hang_from_the_root() -> None:
    text = "\n".join(
        [
            "BlockName=b1 BlockIndex=0 Nodes=n[1-2] BlockSize=2",
            "BlockName=b2 BlockIndex=1 Nodes=n[3-4] BlockSize=2",
            "BlockName=b3 BlockIndex=2 Nodes=n[5-6] BlockSize=2",
            "BlockName=b4 BlockIndex=3 Nodes=n[7-8] BlockSize=2",
            "BlockName=b5 BlockIndex=4 Nodes=n[9-10] BlockSize=2",
            "AggregatedBlock=b[1-2] BlockIndex=5 Nodes=n[1-4] BlockSize=4",
            "AggregatedBlock=b[3-4] BlockIndex=6 Nodes=n[5-8] BlockSize=4",
            "AggregatedBlock=b[1-4] BlockIndex=7 Nodes=n[1-8] BlockSize=8",
        ]
    )
    tree = parse.topology_from_text(text)
    assert tree is not None
    assert tree.path("n3") == ("b2", "b[1-2]", "b[1-4]", "fabric")
    assert tree.path("n9") == ("b5", "fabric")
    assert tree.switches["b[1-4]"].switches == ("b[1-2]", "b[3-4]")


def test_a_switch_with_nodes_of_its_own_keeps_them() -> None:
    text = "SwitchName=l1 Nodes=n[1-2]\nSwitchName=top Nodes=n[1-3] Switches=l1\n"
    tree = parse.topology_from_text(text)
    assert tree is not None
    assert tree.switches["top"].nodes == ("n3",)
    assert tree.leaf_of("n3") == "top" and tree.leaf_of("n1") == "l1"


def test_racks_override_slurm() -> None:
    slurm = MemorySlurm([f"n{i}" for i in range(1, 5)])
    slurm.tree = Topology({"s1": Switch("s1", ("n1", "n2", "n3", "n4"))})
    racks = load_topology(slurm, {"r1": "n[1-2]", "r2": "n[3-4]"})
    assert racks is not None and racks.source == "racks"
    assert racks.leaves() == ["r1", "r2"] and racks.path("n3") == ("r2", "fabric")
    from_slurm = load_topology(slurm, {})
    assert from_slurm is slurm.tree


def test_neither_racks_nor_a_plugin_is_none() -> None:
    assert load_topology(MemorySlurm(["n1"]), {}) is None


def test_a_rack_that_does_not_expand_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        load_topology(MemorySlurm(["n1"]), {"r1": "n[1-"})


def test_a_slurm_error_reaches_the_caller() -> None:
    class Down:
        def topology(self) -> Topology | None:
            raise SlurmUnavailable("scontrol: Slurm controller not reachable")

    with pytest.raises(SlurmUnavailable):
        load_topology(Down(), {})
    # The override needs no Slurm at all.
    assert load_topology(Down(), {"r1": "n1"}) is not None
