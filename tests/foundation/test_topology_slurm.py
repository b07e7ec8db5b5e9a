"""guardctl's Slurm client reads the network tree from the lab's own controller (topology/tree,
and topology/block where the release has it), on the lab's release."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from labtools import lab_release

from guardctl.sections.slurm import SlurmSettings
from guardctl.slurm.cli_backend import CliSlurm
from guardctl.topology import load_topology

pytestmark = pytest.mark.slurm


def client(lab: Any) -> CliSlurm:
    return CliSlurm(
        SlurmSettings(conf=str(lab.conf), bin_dir=str(lab.bin_dir or ""), timeout_s=20),
        environ=lab.env,
    )


def lab_with(factory: Callable[..., Any], tmp: Path, plugin: str, conf: str, nodes: int) -> Any:
    (tmp / "extra.conf").write_text(f"TopologyPlugin={plugin}\n")
    (tmp / "topology.conf").write_text(conf)
    args = ["--conf-extra", str(tmp / "extra.conf"), "--topology", str(tmp / "topology.conf")]
    return factory(nodes=nodes, up_args=args)


def test_no_plugin_no_tree(lab: Any) -> None:
    assert client(lab).topology() is None


def test_a_two_leaf_tree(lab_factory: Callable[..., Any], tmp_path: Path) -> None:
    conf = "SwitchName=s1 Nodes=node[1-2]\nSwitchName=s2 Nodes=node[3-4]\n"
    conf += "SwitchName=s0 Switches=s[1-2]\n"
    tree_lab = lab_with(lab_factory, tmp_path, "topology/tree", conf, 4)
    tree = load_topology(client(tree_lab), {})
    assert tree is not None and tree.source == "slurm"
    assert tree.leaves() == ["s1", "s2"]
    assert tree.path("node1") == ("s1", "s0") and tree.path("node4") == ("s2", "s0")


def test_blocks(lab_factory: Callable[..., Any], tmp_path: Path) -> None:
    if tuple(int(p) for p in lab_release().split(".")) < (24, 11):
        pytest.skip(f"Slurm {lab_release()} has no topology/block")
    conf = "BlockName=b1 Nodes=node[1-2]\nBlockName=b2 Nodes=node[3-4]\nBlockSizes=2,4\n"
    tree = client(lab_with(lab_factory, tmp_path, "topology/block", conf, 4)).topology()
    assert tree is not None and tree.leaves() == ["b1", "b2"]
    assert tree.leaf_of("node3") == "b2"
