"""The simulated cluster's network tree, and its fabric faults' names.

Nodes hang from leaf switches in their order (``leaf_nodes`` to a leaf, so a large job spans
a few leaves), leaves from spine groups (``spine_leaves`` to a group), the groups from one
core. Switches are named as the telemetry simulator names them (:func:`guardctl.simulate.
fleet.tree`): leaves ``leaf01``, spine groups ``spine01``, the root ``core``; components as
every record spells them (``leaf:leaf01``, ``uplink:leaf01``, ``spine:spine01``,
``link:node00017``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from guardctl.topology import ComponentKind, Switch, Topology, component

ROOT = "core"
# The fault kinds that slow every node beneath a switch, and the component each names; a bad
# cable slows its one node and is that node's to repair (it is kept with the node's faults).
SWITCH_FAULTS: dict[str, ComponentKind] = {"leaf": "leaf", "uplink": "uplink", "spine": "spine"}
CABLE = "cable"


def leaf_name(index: int) -> str:
    return f"leaf{index + 1:02d}"


def group_name(index: int) -> str:
    return f"spine{index + 1:02d}"


def counts(nodes: int, leaf_nodes: int, spine_leaves: int) -> tuple[int, int]:
    """How many leaves and spine groups a fleet of *nodes* has."""
    leaves = math.ceil(nodes / leaf_nodes)
    return leaves, math.ceil(leaves / spine_leaves)


def tree(names: Sequence[str], leaf_nodes: int, spine_leaves: int) -> Topology:
    """The fleet's tree: *names* in order, ``leaf_nodes`` to a leaf, ``spine_leaves`` leaves
    to a spine group."""
    leaves, groups = counts(len(names), leaf_nodes, spine_leaves)
    switches: dict[str, Switch] = {}
    for i in range(leaves):
        switches[leaf_name(i)] = Switch(
            leaf_name(i), tuple(names[i * leaf_nodes : (i + 1) * leaf_nodes])
        )
    for g in range(groups):
        below = tuple(
            leaf_name(i) for i in range(g * spine_leaves, min(leaves, (g + 1) * spine_leaves))
        )
        switches[group_name(g)] = Switch(group_name(g), (), below)
    switches[ROOT] = Switch(ROOT, (), tuple(group_name(g) for g in range(groups)))
    return Topology(switches, "simulation")


def switch_of(kind: str, index: int) -> str:
    """The switch a switch fault of *kind* at *index* sits on (a leaf or a spine group)."""
    return group_name(index) if kind == "spine" else leaf_name(index)


def component_of(kind: str, index: int) -> str:
    """The component a switch fault names."""
    return component(SWITCH_FAULTS[kind], switch_of(kind, index))
