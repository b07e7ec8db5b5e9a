"""Fabric localisation: the smallest set of fabric components that explains the nodes at fault.

Group testing over the network tree (:mod:`guardctl.topology`). Every node that carried
traffic in a window is a test of the components its traffic crossed: a node with network
symptoms (transmit wait, port errors, flaps, a rate downshift, slow communication) says one of
its components is bad; a node judged healthy says its leaf, and the leaf's uplinks, are good;
a pairwise all-reduce of two nodes tests exactly the components on the path between them.

The rules, in the order they are applied:

* **spine**: nodes with network symptoms on every leaf (two or more) beneath one switch above
  the leaves, and some leaf outside it healthy: that switch and its links (one finding, not
  one per leaf);
* **leaf / uplink**: most of a leaf's judged nodes with network symptoms (two or more of them
  persistent, or three or more that came and went together), nodes on other leaves healthy:
  the leaf. Its uplinks instead when the pairwise results say traffic inside the leaf is fine
  and traffic leaving it is not, or, without them, when the symptoms come and go (a flapping
  link) rather than stay (a degraded switch). A leaf whose sibling leaves' symptoms are still
  arriving waits a pass (it may be their spine);
* **link**: one node's own port errors, flaps, rate downshift or transmit wait with its leaf
  healthy: that node's cable, port or NIC. A link finding is a node fault under a healthy
  switch: the node's own finding stays, the link finding says what to reseat and what settles
  it.

A node whose symptoms include something other than the network (busy time, GPU signals) is
never explained by the fabric alone. Pure functions, tested by handing them values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from guardctl.analyze.engine import HEALTHY, SUSPECT, Analysis
from guardctl.topology import ComponentKind, Topology, component

# A node's own port speaking: the link is the first suspect.
PORT = frozenset({"link_errors", "link_flaps", "link_rate"})
# The fabric beyond the port slow: its switch, or the port itself when alone.
CONGESTION = frozenset({"xmit_wait", "comm"})
NETWORK = PORT | CONGESTION

MIN_NODES = 2  # a switch is named on two or more of its nodes, never on one
MOST = 0.5  # more than this share of a switch's judged nodes must show symptoms
TOGETHER = 3  # nodes of one leaf whose passing symptoms came and went together


@dataclass(frozen=True)
class FabricFinding:
    """One fabric component at fault, the nodes behind it, and the case for and against."""

    component: str  # "leaf:s1", "link:node3" (guardctl.topology.component)
    kind: ComponentKind
    nodes: tuple[str, ...]  # the nodes whose traffic goes through it
    evidence_for: tuple[str, ...]  # one line each
    evidence_against: tuple[str, ...]
    confidence: float  # 0..1
    settle: str  # the test that would settle it, in the operator's words

    def as_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "kind": self.kind,
            "nodes": list(self.nodes),
            "evidence_for": list(self.evidence_for),
            "evidence_against": list(self.evidence_against),
            "confidence": self.confidence,
            "settle": self.settle,
        }


@dataclass(frozen=True)
class Symptom:
    """A node at fault in the window and the kinds of its evidence.

    *signals*: detector names, and ``comm`` for slow communication; *current*: flagged in the
    newest window (False: flagged before and not now, a symptom that comes and goes);
    *persistent*: flagged in enough windows to be acted on (the analyzer's ``suspect``). A
    component is named on persistent symptoms only; the others count for how they come and go.
    """

    node: str
    signals: frozenset[str]
    current: bool = True
    detail: tuple[str, ...] = ()
    persistent: bool = True

    @property
    def network(self) -> frozenset[str]:
        return self.signals & NETWORK

    @property
    def only_network(self) -> bool:
        return bool(self.signals) and self.signals <= NETWORK


@dataclass(frozen=True)
class PairResult:
    """A pairwise all-reduce of nodes *a* and *b*: slow or not."""

    a: str
    b: str
    slow: bool
    detail: str = ""


@dataclass
class _Case:
    """What the observations say about one switch's nodes."""

    sick: list[Symptom] = field(default_factory=list)
    healthy: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        seen = len(self.sick) + len(self.healthy)
        return len(self.sick) / seen if seen else 0.0

    @property
    def fading(self) -> bool:
        """Most of its symptoms came and went (flagged before, not in the newest window)."""
        gone = sum(1 for s in self.sick if not s.current)
        return gone * 2 > len(self.sick)

    @property
    def leaning(self) -> bool:
        """Most of its judged nodes sick, two or more, persistent or not yet."""
        return self.share > MOST and len(self.sick) >= MIN_NODES

    @property
    def at_fault(self) -> bool:
        """Most of its judged nodes sick: two or more of them persistently, or three or more
        that came and went together (each too briefly to be persistent on its own: a
        flapping link's mark)."""
        if self.share <= MOST:
            return False
        lasting = sum(1 for s in self.sick if s.persistent)
        return lasting >= MIN_NODES or (len(self.sick) >= TOGETHER and self.fading)


def localise(
    topology: Topology,
    symptoms: Iterable[Symptom],
    judged: Iterable[str],
    pairwise: Iterable[PairResult] = (),
) -> tuple[FabricFinding, ...]:
    """The smallest set of components that explains the network *symptoms*, strongest first.

    *judged*: nodes judged healthy that carried traffic (evidence against their components);
    *pairwise*: all-reduce results of node pairs. Nodes the tree does not hold are left out.
    """
    sick, cases = _cases(topology, symptoms, judged)
    pairs = [p for p in pairwise if topology.leaf_of(p.a) and topology.leaf_of(p.b)]
    out: list[FabricFinding] = []
    taken: set[str] = set()  # leaves a finding above them already explains
    faulty = [leaf for leaf, case in cases.items() if case.at_fault]
    for spine in _spines(topology, faulty):
        found = _spine_finding(topology, spine, cases)
        if found is not None:
            out.append(found)
            taken.update(_leaves_under(topology, spine))
    for leaf, case in sorted(cases.items()):
        if leaf in taken or not case.at_fault or not _others_healthy(cases, [leaf]):
            continue
        if _spine_forming(topology, leaf, cases):
            continue
        out.append(_leaf_finding(topology, leaf, case, pairs))
        taken.add(leaf)
    explained = {n for f in out for n in f.nodes}
    for s in sorted(sick.values(), key=lambda s: s.node):
        if not s.persistent or not _own_link(
            s, cases[topology.leaf_of(s.node) or ""], s.node in explained
        ):
            continue
        link = _link_finding(topology, s, cases, pairs)
        if link is not None:
            out.append(link)
    out.sort(key=lambda f: (-f.confidence, f.component))
    return tuple(out)


def _cases(
    topology: Topology, symptoms: Iterable[Symptom], judged: Iterable[str]
) -> tuple[dict[str, Symptom], dict[str, _Case]]:
    """The nodes with network symptoms, and what the observations say about each leaf."""
    sick = {s.node: s for s in symptoms if s.network and topology.leaf_of(s.node) is not None}
    healthy = sorted({n for n in judged if n not in sick and topology.leaf_of(n) is not None})
    cases: dict[str, _Case] = {leaf: _Case() for leaf in topology.leaves()}
    for s in sick.values():
        cases[topology.leaf_of(s.node) or ""].sick.append(s)
    for n in healthy:
        cases[topology.leaf_of(n) or ""].healthy.append(n)
    return sick, cases


def forming(
    topology: Topology, symptoms: Iterable[Symptom], judged: Iterable[str]
) -> dict[str, str]:
    """Nodes on a leaf most of whose judged nodes show network symptoms (two or more), whether
    or not a component is named yet: node -> leaf. While a fabric fault's symptoms arrive
    (some nodes persistent, others not yet), such a node is the fabric's to explain, not a
    node fault to act on."""
    _, cases = _cases(topology, symptoms, judged)
    return {s.node: leaf for leaf, case in cases.items() if case.leaning for s in case.sick}


def _spine_forming(topology: Topology, leaf: str, cases: dict[str, _Case]) -> bool:
    """Whether *leaf*'s sibling leaves under a spine show most of their nodes sick too, not
    yet persistently: the spine group's symptoms arriving, not one leaf's (wait a pass)."""
    parent = topology.parent_of(leaf)
    if topology.source == "racks" or parent is None or topology.parent_of(parent) is None:
        return False
    siblings = [s for s in topology.switches[parent].switches if s != leaf and s in cases]
    return any(not cases[s].at_fault and cases[s].leaning for s in siblings)


def _spines(topology: Topology, leaves: Sequence[str]) -> list[str]:
    """The switches above *leaves* that are components of their own, lowest first (a spine
    group is named before the core above it): none for a racks stand-in (``[control] racks``
    says nothing of the switches above the racks)."""
    if topology.source == "racks":
        return []
    above = {s for leaf in leaves for s in topology.path(topology.switches[leaf].nodes[0])[1:]}
    return sorted(above, key=lambda s: (len(topology.nodes_under(s)), s))


def _leaves_under(topology: Topology, switch: str) -> list[str]:
    """The leaves beneath *switch*, at any depth."""
    out, todo, seen = [], [switch], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in topology.switches:
            continue
        seen.add(name)
        if topology.switches[name].nodes:
            out.append(name)
        todo.extend(topology.switches[name].switches)
    return sorted(out)


def _others_healthy(cases: dict[str, _Case], inside: Sequence[str]) -> bool:
    """Whether traffic outside *inside* is judged fine somewhere: some leaf outside has
    healthy judged nodes and is not itself at fault. Without that, the cause is not one
    switch's (a fleet-wide slowdown, the software)."""
    return any(c.healthy and not c.at_fault for leaf, c in cases.items() if leaf not in inside)


def _spine_finding(topology: Topology, spine: str, cases: dict[str, _Case]) -> FabricFinding | None:
    leaves = _leaves_under(topology, spine)
    seen = [leaf for leaf in leaves if cases[leaf].sick or cases[leaf].healthy]
    if len(seen) < 2 or not all(cases[leaf].at_fault for leaf in seen):
        return None
    if not _others_healthy(cases, leaves):
        return None
    sick = [s for leaf in seen for s in cases[leaf].sick]
    healthy = [n for leaf in seen for n in cases[leaf].healthy]
    outside = sum(len(c.healthy) for leaf, c in cases.items() if leaf not in leaves)
    share = len(sick) / (len(sick) + len(healthy))
    return FabricFinding(
        component("spine", spine),
        "spine",
        topology.nodes_under(spine),
        (
            f"{len(sick)} nodes with network symptoms on every one of the {len(seen)} leaves "
            f"under {spine} ({', '.join(seen)}): {_signals(sick)}",
            f"{outside} judged nodes under other switches healthy",
        ),
        tuple(f"{n} under {spine} judged healthy" for n in healthy[:5]),
        _confidence(share, len(sick)),
        f"pairwise sweep: two nodes on one leaf under {spine}, then one on each of two leaves "
        f"under {spine}, then one under {spine} with one under another switch "
        "(only traffic through the spine slow: the spine group)",
    )


def _leaf_finding(
    topology: Topology, leaf: str, case: _Case, pairs: Sequence[PairResult]
) -> FabricFinding:
    inside = set(topology.switches[leaf].nodes)
    within = [p for p in pairs if p.a in inside and p.b in inside]
    across = [p for p in pairs if (p.a in inside) != (p.b in inside)]
    names = sorted(s.node for s in case.sick)
    evidence = [
        f"{len(case.sick)} of {len(case.sick) + len(case.healthy)} judged nodes on leaf "
        f"{leaf} with network symptoms ({', '.join(names[:6])}"
        f"{' ...' if len(names) > 6 else ''}): {_signals(case.sick)}",
        "nodes on other leaves judged healthy",
    ]
    against = [f"{n} on {leaf} judged healthy" for n in case.healthy[:5]]
    confidence = _confidence(case.share, len(case.sick))
    kind: ComponentKind = "leaf"
    if within or across:
        kind, why, agree = _by_pairs(within, across)
        evidence += why
        confidence = min(0.95, confidence + 0.2) if agree else confidence * 0.6
    else:
        fading = [s for s in case.sick if not s.current]
        if case.fading:
            kind = "uplink"
            evidence.append(
                f"the symptoms come and go ({len(fading)} of {len(case.sick)} nodes flagged "
                "before, not now): a flapping link, not a degraded switch"
            )
        other = "uplink" if kind == "leaf" else "leaf"
        against.append(
            f"{other}:{leaf} explains the same nodes (no pairwise result tells them apart)"
        )
        confidence *= 0.8
    return FabricFinding(
        component(kind, leaf),
        kind,
        tuple(sorted(inside)),
        tuple(evidence),
        tuple(against),
        round(confidence, 2),
        f"pairwise sweep of {names[0]} with a partner on leaf {leaf} and one on another "
        f"leaf (slow on {leaf} too: the leaf; slow only across: its uplinks)",
    )


def _by_pairs(
    within: Sequence[PairResult], across: Sequence[PairResult]
) -> tuple[ComponentKind, list[str], bool]:
    """Leaf or uplink from the pairwise results; whether they agree with the symptoms."""
    slow_in = [p for p in within if p.slow]
    slow_out = [p for p in across if p.slow]
    lines = [
        f"pairwise inside the leaf: {len(slow_in)} of {len(within)} pairs slow",
        f"pairwise across leaves: {len(slow_out)} of {len(across)} pairs slow",
    ]
    if slow_in:
        return "leaf", lines, True
    if within and slow_out:
        return "uplink", lines, True
    return "leaf", lines, bool(slow_out)


def _own_link(s: Symptom, case: _Case, explained: bool) -> bool:
    """Whether *s* points at its node's own link.

    Port errors, flaps or a downshift do, unless a named switch explains them and other nodes
    of the leaf show them too (a bad cable does not hide behind a bad switch); a transmit wait
    of its own does only when most of its leaf is not sick too (then the leaf is likelier)
    and the node shows nothing else (a node slow for its own reasons is a node fault).
    """
    if s.signals & PORT:
        return not explained or sum(1 for o in case.sick if o.signals & PORT) < MIN_NODES
    return not explained and not case.leaning and s.only_network


def _link_finding(
    topology: Topology, s: Symptom, cases: dict[str, _Case], pairs: Sequence[PairResult]
) -> FabricFinding | None:
    """The node's own link, for port signals or a transmit wait of its own; None for a node
    slow only in communication (that is the node, or not the fabric's to say)."""
    if not s.network & (PORT | {"xmit_wait"}):
        return None
    leaf = topology.leaf_of(s.node) or ""
    case = cases[leaf]
    peers = [o for o in case.sick if o.node != s.node]
    evidence = [f"{s.node}: {', '.join(sorted(s.network))}", *s.detail[:3]]
    against: list[str] = []
    if case.healthy:
        evidence.append(f"{len(case.healthy)} leaf peers on {leaf} judged healthy")
    else:
        against.append(f"no leaf peer on {leaf} judged healthy (the leaf is not ruled out)")
    if peers:
        against.append(f"{len(peers)} other node(s) on {leaf} with network symptoms")
    if not s.only_network:
        against.append(f"{s.node} also slow in {', '.join(sorted(s.signals - NETWORK))}")
    mine = [p for p in pairs if s.node in (p.a, p.b)]
    fine = [p for p in mine if not p.slow]
    if fine:
        against.append(f"{len(fine)} pairwise all-reduce(s) with {s.node} healthy")
    if any(p.slow for p in mine):
        evidence.append(f"{sum(p.slow for p in mine)} pairwise all-reduce(s) with it slow")
    strength = 0.85 if s.signals & PORT else 0.6  # a port's own errors speak louder than a wait
    confidence = strength * (1.0 if case.healthy else 0.7) * (0.5 if fine else 1.0)
    return FabricFinding(
        component("link", s.node),
        "link",
        (s.node,),
        tuple(evidence),
        tuple(against),
        round(confidence, 2),
        f"pairwise sweep of {s.node} with a partner on leaf {leaf} and one on another leaf; "
        f"then reseat or swap its cable ({', '.join(sorted(s.network))} following the cable: "
        "the cable; staying with the node: its NIC)",
    )


def _confidence(share: float, count: int) -> float:
    """More of the switch's nodes, and more nodes in all, make a switch likelier."""
    return round(min(0.95, share * (1.0 - 0.5**count)), 2)


def _signals(sick: Sequence[Symptom]) -> str:
    counts: dict[str, int] = {}
    for s in sick:
        for name in s.network:
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} on {n}" for name, n in sorted(counts.items()))


# --- from an analysis ------------------------------------------------------------------------


def symptoms_of(analysis: Analysis, comm: Iterable[str] = ()) -> tuple[list[Symptom], list[str]]:
    """The analysis' flagged nodes as symptoms, and the nodes judged healthy that carried
    traffic (in a job of two or more nodes: an idle node's fabric is not tested).

    *comm*: nodes known to be slow in communication (a caller's own measurement).
    """
    sizes: dict[str, int] = {}
    for v in analysis.nodes:
        if v.job is not None:
            sizes[v.job] = sizes.get(v.job, 0) + 1
    slow_comm = set(comm)
    symptoms = []
    for v in analysis.nodes:
        signals = {e.detector for e in v.evidence} | ({"comm"} if v.node in slow_comm else set())
        if not signals:
            continue
        current = any(e.window_end >= analysis.window_end for e in v.evidence)
        detail = tuple(v.reasons[:3])
        symptoms.append(
            Symptom(
                v.node,
                frozenset(signals),
                current or not v.evidence,
                detail,
                v.verdict == SUSPECT,
            )
        )
    judged = [
        v.node
        for v in analysis.nodes
        if v.verdict == HEALTHY
        and v.job is not None
        and sizes.get(v.job, 0) >= 2
        and v.node not in slow_comm
    ]
    return symptoms, judged
