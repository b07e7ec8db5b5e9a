"""The cluster's network tree: which leaf switch each node hangs from, and what is above it.

Slurm's topology/tree plugin knows it (``topology.conf``, shown by ``scontrol show
topology``); ``[control] racks`` stands in for sites without a topology plugin (each rack one
leaf under one root). Fabric localisation (:mod:`guardctl.analyze.fabric`) and topology-aware
sweeps read it through :class:`Topology`.

A *component* is one thing of the fabric that can be at fault, named ``kind:name``:

* ``link:<node>``: the node's NIC, port and cable to its leaf;
* ``leaf:<switch>``: a leaf switch (every node directly under it);
* ``uplink:<switch>``: a leaf's links to the switch above it (its nodes' traffic that leaves
  the leaf);
* ``spine:<switch>``: a switch above the leaves and everything beneath it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from guardctl.nodes import expand

ComponentKind = Literal["link", "leaf", "uplink", "spine"]
COMPONENT_KINDS: tuple[ComponentKind, ...] = ("link", "leaf", "uplink", "spine")


@dataclass(frozen=True)
class Switch:
    """One switch of the tree: the nodes directly under it and the switches under it."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


def component(kind: ComponentKind, name: str) -> str:
    """A component's name as findings and records spell it: ``leaf:s1``."""
    return f"{kind}:{name}"


def split_component(text: str) -> tuple[ComponentKind, str]:
    """``leaf:s1`` -> ("leaf", "s1"); ValueError for anything else."""
    kind, sep, name = text.partition(":")
    if not sep or not name or kind not in COMPONENT_KINDS:
        raise ValueError(
            f"invalid fabric component {text!r} (want KIND:NAME, KIND one of "
            f"{', '.join(COMPONENT_KINDS)})"
        )
    return kind, name


@dataclass(frozen=True)
class Topology:
    """A tree of switches. ``source`` says where it came from (``slurm`` or ``racks``)."""

    switches: Mapping[str, Switch]
    source: str = "slurm"
    _parent: dict[str, str] = field(init=False, repr=False, compare=False)
    _leaf: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parent = {child: s.name for s in self.switches.values() for child in s.switches}
        leaf = {node: s.name for s in self.switches.values() for node in s.nodes}
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_leaf", leaf)

    def leaf_of(self, node: str) -> str | None:
        """The switch *node* hangs from directly, or None if the tree does not hold it."""
        return self._leaf.get(node)

    def parent_of(self, switch: str) -> str | None:
        return self._parent.get(switch)

    def leaves(self) -> list[str]:
        """Switches with nodes directly under them, by name."""
        return sorted(s.name for s in self.switches.values() if s.nodes)

    def path(self, node: str) -> tuple[str, ...]:
        """The switches from *node*'s leaf up to the root; () when the tree does not hold it."""
        out: list[str] = []
        at = self.leaf_of(node)
        while at is not None and at not in out:
            out.append(at)
            at = self.parent_of(at)
        return tuple(out)

    def nodes_under(self, switch: str) -> tuple[str, ...]:
        """Every node beneath *switch*, at any depth, sorted."""
        out: set[str] = set()
        todo, seen = [switch], set()
        while todo:
            name = todo.pop()
            if name in seen or name not in self.switches:
                continue
            seen.add(name)
            out.update(self.switches[name].nodes)
            todo.extend(self.switches[name].switches)
        return tuple(sorted(out))

    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted(self._leaf))

    @classmethod
    def from_groups(cls, groups: Mapping[str, Iterable[str]], source: str) -> Topology:
        """One leaf per group under a single root named ``fabric`` (``[control] racks``)."""
        leaves = {name: Switch(name, tuple(sorted(nodes))) for name, nodes in groups.items()}
        root = Switch("fabric", (), tuple(sorted(leaves)))
        return cls({**leaves, "fabric": root}, source)


class TreeSource(Protocol):
    """What :func:`load_topology` needs of Slurm (every ``SlurmClient`` has it)."""

    def topology(self) -> Topology | None: ...


def load_topology(slurm: TreeSource, racks: Mapping[str, str]) -> Topology | None:
    """The tree fabric localisation and sweeps use.

    ``[control] racks`` (``{rack: hostlist}``), when set, overrides Slurm: one leaf per rack
    (source ``racks``). Otherwise Slurm's topology plugin (source ``slurm``); None when neither
    has one. A Slurm error (:class:`guardctl.errors.SlurmError`) propagates: the caller decides
    what a tree it cannot read means.
    """
    if racks:
        return Topology.from_groups({rack: expand(nodes) for rack, nodes in racks.items()}, "racks")
    return slurm.topology()
