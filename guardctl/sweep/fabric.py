"""Topology-aware pairing: tell a node from its link, its leaf switch, the leaf's uplink or a
spine group, in few rounds of pairwise all-reduce tests.

A pairwise test over a group carries traffic through each member's link (``link:<node>``: the
node itself, its NIC, port and cable, which an all-reduce cannot tell apart) and each member's
leaf switch; when the group spans leaves, also through each member's leaf uplink and every
switch from the leaves up to the one where the members' paths meet (:func:`carried`). A test is
slow when any component it carries is at fault, so:

* a passing test clears every component it carries (known-good partners' links are clear from
  the start: they are known good);
* the components at fault are the smallest set that every failed test carries one of (group
  testing: the minimum hitting sets of the failed tests' uncleared components, each connected
  cluster of failed tests on its own); where one such set remains, it is the verdict;
* while several remain (a suspect slow with a partner on another leaf: its link? its leaf? the
  uplink? the partner's leaf?), the next round runs the tests that split them best: a suspect
  with a partner on its own leaf, another node of its leaf with a partner on another leaf or in
  another spine group, two nodes of one leaf (leaf or uplink), each node in one test per round.

A suspect slow with partners on every leaf is ``link:<node>`` (a node fault: drained as
before); a leaf whose nodes are slow with every partner while tests inside other leaves pass is
``leaf:<switch>`` (or ``uplink:<switch>`` when its nodes pass among themselves), and the
suspects behind it are not the fault. Round 1 pairs every suspect across leaves (a known-good
partner first, else another suspect), and pairs the spare partners across leaves as controls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

from guardctl.sweep.pairing import Group, Oracle, Outcome
from guardctl.topology import Topology, component, split_component

MAX_FAULTS = 3  # components at fault at once in one cluster of failed tests, at most
MAX_ROUNDS = 8  # rounds after the first, at most


def carried(group: Group, topology: Topology) -> frozenset[str]:
    """The components a group's all-reduce traffic goes through."""
    out = {component("link", n) for n in group}
    paths = {n: topology.path(n) for n in group}
    for path in paths.values():
        if path:
            out.add(component("leaf", path[0]))
    placed = [p for p in paths.values() if p]
    if len({p[0] for p in placed}) > 1 or len(placed) < len(group):
        common = set.intersection(*(set(p) for p in placed)) if placed else set()
        for path in placed:
            out.add(component("uplink", path[0]))
            for switch in path[1:]:
                out.add(component("spine", switch))
                if switch in common:  # where the paths meet: no higher
                    break
    return frozenset(out)


@dataclass
class _Evidence:
    topology: Topology
    cleared: set[str] = field(default_factory=set)  # components a passing test carried
    failed: list[Group] = field(default_factory=list)

    def unknown(self, group: Group) -> frozenset[str]:
        return carried(group, self.topology) - self.cleared

    def learn(self, group: Group, ok: bool | None) -> None:
        if ok:
            self.cleared |= carried(group, self.topology)
        elif ok is False:
            self.failed.append(group)

    def clusters(self) -> list[list[frozenset[str]]]:
        """The smallest explanations of each cluster of failed tests that share a component."""
        sets = [self.unknown(g) for g in self.failed]
        groups: list[list[frozenset[str]]] = []
        for s in sets:
            joined = [c for c in groups if any(s & other for other in c)]
            merged = [s, *(x for c in joined for x in c)]
            groups = [c for c in groups if c not in joined] + [merged]
        return [_explanations(c) for c in groups]


def _explanations(sets: list[frozenset[str]]) -> list[frozenset[str]]:
    """Every smallest set of components that each of *sets* holds one of ([] past MAX_FAULTS,
    or when a failed test carries nothing uncleared: the failure has no explanation here)."""
    if any(not s for s in sets):
        return []
    universe = sorted(set().union(*sets))
    for size in range(1, MAX_FAULTS + 1):
        found = [
            frozenset(c) for c in combinations(universe, size) if all(s & set(c) for s in sets)
        ]
        if found:
            return found
    return []


def _leaf(topology: Topology, node: str) -> str:
    return topology.leaf_of(node) or ""


def screen(
    suspects: Sequence[str], goods: Sequence[str], topology: Topology, partners: int
) -> list[Group]:
    """Round 1: every suspect across leaves (a known-good partner first), spare partners paired
    across leaves as controls."""
    free_goods = list(goods)
    free = list(suspects)
    plan: list[Group] = []
    while free:
        node = free.pop(0)
        leaf = _leaf(topology, node)
        across = [g for g in free_goods if _leaf(topology, g) != leaf] or free_goods
        if across:
            chosen = across[:partners]
            for g in chosen:
                free_goods.remove(g)
            plan.append((node, *chosen))
            continue
        other = [s for s in free if _leaf(topology, s) != leaf] or free
        if other:
            mate = other[0]
            free.remove(mate)
            plan.append((node, mate))
    while len(free_goods) >= 2:
        a = free_goods.pop(0)
        b = next((g for g in free_goods if _leaf(topology, g) != _leaf(topology, a)), None)
        if b is None:
            break
        free_goods.remove(b)
        plan.append((a, b))
    return plan


def _open_questions(
    evidence: _Evidence, suspects: Sequence[str]
) -> tuple[list[list[frozenset[str]]], set[str]]:
    """Clusters still explained more than one way, and the convicted components."""
    open_ones: list[list[frozenset[str]]] = []
    convicted: set[str] = set()
    for hypotheses in evidence.clusters():
        if len(hypotheses) == 1:
            convicted |= hypotheses[0]
        elif hypotheses:
            open_ones.append(hypotheses)
    in_question = {c for hypotheses in open_ones for h in hypotheses for c in h}
    for node in suspects:
        link = component("link", node)
        if link in evidence.cleared or link in convicted or link in in_question:
            continue
        if _behind(evidence, node, convicted):
            continue
        # Not shown good, nor bad, nor behind a faulty switch: slow beside another bad node
        # only, or its tests measured nothing.
        open_ones.append([frozenset({link}), frozenset()])
    return open_ones, convicted


def _behind(evidence: _Evidence, node: str, convicted: set[str]) -> list[str]:
    """The convicted switch-level components that explain every slow test of *node* ([] when
    one of them is not explained so)."""
    mine = [evidence.unknown(g) for g in evidence.failed if node in g]
    found = sorted({c for u in mine for c in u & convicted if not c.startswith("link:")})
    if mine and all(u & set(found) for u in mine):
        return found
    return []


def _next_round(
    evidence: _Evidence, nodes: Sequence[str], open_ones: list[list[frozenset[str]]]
) -> list[Group]:
    """Node-disjoint tests that split the open explanations best; each test's uncleared
    components few (a test that carries one uncleared component decides it)."""
    scored = []
    done = set(evidence.failed)
    for a, b in combinations(nodes, 2):
        unknown = evidence.unknown((a, b))
        if not unknown or (a, b) in done or (b, a) in done:
            continue
        score = 0
        for hypotheses in open_ones:
            hit = sum(1 for h in hypotheses if h & unknown)
            score += min(hit, len(hypotheses) - hit)
        if score:
            scored.append((-score, len(unknown), a, b, unknown))
    scored.sort(key=lambda t: (t[0], t[1], t[2], t[3]))
    busy: set[str] = set()
    seen: set[frozenset[str]] = set()
    plan: list[Group] = []
    for _, _, a, b, unknown in scored:
        if a in busy or b in busy or unknown in seen:
            continue
        busy |= {a, b}
        seen.add(unknown)
        plan.append((a, b))
    return plan


def localise(
    suspects: Sequence[str],
    goods: Sequence[str],
    oracle: Oracle,
    topology: Topology,
    *,
    partners: int = 1,
) -> Outcome:
    """Find which suspects are bad, and which fabric components explain the others' failures
    (``Outcome.fabric``: component -> the suspects behind it)."""
    outcome = Outcome(fabric_aware=True)
    evidence = _Evidence(topology, cleared={component("link", g) for g in goods})
    plan = screen(suspects, goods, topology, partners)
    tested = {n for g in plan for n in g}
    outcome.undetermined.update(n for n in suspects if n not in tested)
    nodes = [*suspects, *goods]
    for _ in range(MAX_ROUNDS + 1):
        if not plan:
            break
        for group, ok in zip(plan, outcome.run_round(oracle, plan), strict=True):
            evidence.learn(group, ok)
        open_ones, _ = _open_questions(evidence, [n for n in suspects if n in tested])
        plan = _next_round(evidence, nodes, open_ones) if open_ones else []
    _conclude(outcome, evidence, [n for n in suspects if n in tested])
    return outcome


def _conclude(outcome: Outcome, evidence: _Evidence, suspects: Sequence[str]) -> None:
    _, convicted = _open_questions(evidence, suspects)
    for node in suspects:
        link = component("link", node)
        if link in evidence.cleared:
            outcome.cleared.add(node)
        elif link in convicted:
            outcome.bad.add(node)
        elif behind := _behind(evidence, node, convicted):
            for c in behind:
                outcome.fabric.setdefault(c, set()).add(node)
        else:
            outcome.undetermined.add(node)
    for c in sorted(convicted):
        if split_component(c)[0] != "link":
            outcome.fabric.setdefault(c, set())


def finding_lines(outcome: Outcome, topology: Topology, name: str) -> tuple[list[str], list[str]]:
    """The tests that point at *name* (failed, carrying it) and those that clear its rivals
    (passed, sharing a node or a switch with it), one line each."""
    kind, switch = split_component(name)
    near = set(topology.nodes_under(switch)) if kind != "link" else {switch}
    against, for_ = [], []
    for round_ in outcome.history:
        for group, ok in round_:
            label = f"pairwise {'+'.join(group)}"
            if ok is False and name in carried(group, topology):
                for_.append(f"{label} slow ({_where(group, topology)})")
            elif ok and near & set(group):
                against.append(f"{label} passed ({_where(group, topology)})")
            elif ok:  # the rest of the fabric carried it well: not a fault beyond this one
                for_.append(f"{label} passed ({_where(group, topology)})")
    return for_, against


def _where(group: Group, topology: Topology) -> str:
    leaves = sorted({topology.leaf_of(n) or "?" for n in group})
    if len(leaves) == 1:
        return f"inside leaf {leaves[0]}"
    return "across leaves " + ", ".join(leaves)


def confidence(outcome: Outcome, topology: Topology, name: str, goods: Sequence[str]) -> float:
    """0.9 when a slow test went through nothing else not cleared by a passing test (the
    fault is shown), 0.6 when it is only the fewest faults that explain every slow test."""
    evidence = _Evidence(topology, cleared={component("link", g) for g in goods})
    for round_ in outcome.history:
        for group, ok in round_:
            evidence.learn(group, ok)
    shown = any(evidence.unknown(g) == {name} for g in evidence.failed)
    return 0.9 if shown else 0.6
