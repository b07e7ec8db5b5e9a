"""Pairing strategies: which nodes run a multi-node all-reduce together, round after round.

A *test* is one all-reduce job over a group of nodes; it fails when any member
(or link) is slow, and says nothing (None) when its job measured nothing: the
suspects in such a group are undetermined, neither cleared nor bad. The tests
of a round run at once, so a node is in at most one group per round, and a
*round* costs one sweep's duration. Strategies:

- ``one_vs_good``: every suspect with ``partners`` known-good nodes. Simple,
  but a round holds only as many tests as there are good partners.
- ``two_round``: round 1 pairs suspects with each other; round 2 tests each
  member of a failed pair with known-good nodes (as the partners allow).
- ``regroup`` (default): round 1 puts suspects in groups of ``group_size``;
  every node of a passing group is cleared *and becomes a partner*, so round 2
  tests all members of failed groups at once, each with cleared partners. A node
  is declared bad only by a test of it alone with cleared partners.

:func:`simulate` runs a strategy against a known set of bad nodes;
``bench/pairing.py`` compares them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from guardctl.topology import Topology

Group = tuple[str, ...]
# Runs a round of groups at once; True for every group that passed, None where nothing was
# measured (the job did not run).
Oracle = Callable[[list[Group]], list[bool | None]]
StrategyName = Literal["regroup", "two_round", "one_vs_good"]


@dataclass
class Outcome:
    """What a strategy concluded, and what it cost."""

    bad: set[str] = field(default_factory=set)  # failed alone with cleared partners
    cleared: set[str] = field(default_factory=set)  # suspects shown good
    # no cleared partner to isolate them, or their group's job measured nothing
    undetermined: set[str] = field(default_factory=set)
    rounds: int = 0
    tests: int = 0
    node_slots: int = 0  # sum of group sizes: node-time spent, in sweep durations
    history: list[list[tuple[Group, bool | None]]] = field(default_factory=list)
    # Topology-aware pairing only: fabric component ("leaf:s2") -> the suspects whose failures it
    # explains (not bad themselves, not cleared: behind a fault of the fabric).
    fabric: dict[str, set[str]] = field(default_factory=dict)
    fabric_aware: bool = False  # partners were chosen by the network tree

    def run_round(self, oracle: Oracle, groups: list[Group]) -> list[bool | None]:
        results = oracle(groups) if groups else []
        if len(results) != len(groups):
            raise ValueError("oracle must judge every group")
        self.rounds += 1
        self.tests += len(groups)
        self.node_slots += sum(len(g) for g in groups)
        self.history.append(list(zip(groups, results, strict=True)))
        return results


def _isolate(
    outcome: Outcome,
    oracle: Oracle,
    unresolved: list[str],
    partners: list[str],
    per_test: int,
    grow: bool,
) -> None:
    """Test each unresolved node alone with ``per_test`` partners, as many per round as fit.

    With *grow*, suspects cleared on the way become partners too.
    """
    queue = list(unresolved)
    pool = list(partners)
    while queue:
        if not pool:
            outcome.undetermined.update(queue)
            return
        width = max(1, len(pool) // per_test)
        batch, queue = queue[:width], queue[width:]
        take = min(per_test, len(pool))
        groups = [
            (node, *pool[i * take : (i + 1) * take])
            if (i + 1) * take <= len(pool)
            else (node, *pool[:take])
            for i, node in enumerate(batch)
        ]
        for group, ok in zip(groups, outcome.run_round(oracle, groups), strict=True):
            if ok is None:
                outcome.undetermined.add(group[0])
            elif ok:
                outcome.cleared.add(group[0])
                if grow:
                    pool.append(group[0])
            else:
                outcome.bad.add(group[0])


def _chunks(nodes: Sequence[str], size: int) -> list[list[str]]:
    groups = [list(nodes[i : i + size]) for i in range(0, len(nodes), size)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())  # a lone suspect cannot all-reduce with itself
    return groups


def _screen(
    outcome: Outcome,
    oracle: Oracle,
    suspects: Sequence[str],
    goods: Sequence[str],
    size: int,
    per_test: int,
) -> list[str]:
    """Round 1: suspects in groups among themselves; returns the members of failed groups."""
    groups = _chunks(suspects, size)
    plan: list[Group] = []
    for g in groups:
        if len(g) == 1:  # only one suspect in all: it needs a good partner from the start
            if not goods:
                outcome.undetermined.update(g)
                continue
            plan.append((g[0], *goods[:per_test]))
        else:
            plan.append(tuple(g))
    failed: list[str] = []
    for group, ok in zip(plan, outcome.run_round(oracle, plan), strict=True):
        members = [n for n in group if n in suspects]
        if ok is None:
            outcome.undetermined.update(members)
        elif ok:
            outcome.cleared.update(members)
        elif len(group) > len(members):  # a lone suspect tested with good partners
            outcome.bad.update(members)
        else:
            failed.extend(members)
    return failed


def regroup(
    suspects: Sequence[str],
    goods: Sequence[str],
    oracle: Oracle,
    *,
    group_size: int = 2,
    partners: int = 1,
) -> Outcome:
    outcome = Outcome()
    failed = _screen(outcome, oracle, suspects, goods, max(2, group_size), partners)
    cleared = [n for n in suspects if n in outcome.cleared]
    _isolate(outcome, oracle, failed, [*goods, *cleared], partners, grow=True)
    return outcome


def two_round(
    suspects: Sequence[str],
    goods: Sequence[str],
    oracle: Oracle,
    *,
    group_size: int = 2,
    partners: int = 1,
) -> Outcome:
    outcome = Outcome()
    failed = _screen(outcome, oracle, suspects, goods, 2, partners)
    _isolate(outcome, oracle, failed, list(goods), partners, grow=False)
    return outcome


def one_vs_good(
    suspects: Sequence[str],
    goods: Sequence[str],
    oracle: Oracle,
    *,
    group_size: int = 2,
    partners: int = 1,
) -> Outcome:
    outcome = Outcome()
    _isolate(outcome, oracle, list(suspects), list(goods), partners, grow=False)
    return outcome


STRATEGIES: dict[str, Callable[..., Outcome]] = {
    "regroup": regroup,
    "two_round": two_round,
    "one_vs_good": one_vs_good,
}


def find_bad(
    strategy: str,
    suspects: Sequence[str],
    goods: Sequence[str],
    oracle: Oracle,
    *,
    group_size: int = 2,
    partners: int = 1,
    topology: Topology | None = None,
) -> Outcome:
    """Run *strategy* over *suspects* with *goods* as known-good partners; with a *topology*
    whose leaves hold them on more than one leaf, partners are chosen by leaf instead, so that
    a node, its link and its switches are told apart (:mod:`guardctl.sweep.fabric`)."""
    if len(set(suspects)) != len(suspects) or set(suspects) & set(goods):
        raise ValueError("suspects must be distinct and not among the good nodes")
    if topology is not None and len({topology.leaf_of(n) for n in [*suspects, *goods]}) > 1:
        from guardctl.sweep.fabric import localise

        return localise(suspects, goods, oracle, topology, partners=partners)
    return STRATEGIES[strategy](suspects, goods, oracle, group_size=group_size, partners=partners)


def simulated_oracle(
    bad: set[str], *, noise: float = 0.0, rng: random.Random | None = None, repeat: int = 1
) -> Oracle:
    """Groups fail when they hold a bad node; *noise* flips a healthy group's result at random.

    *repeat*: a failing group is rerun this many times and fails only if it fails every
    time (the sweep engine's repeat-once rule).
    """
    rand = rng or random.Random(0)

    def once(group: Group) -> bool:
        if bad & set(group):
            return False
        return rand.random() >= noise

    def oracle(groups: list[Group]) -> list[bool | None]:
        return [once(g) or any(once(g) for _ in range(repeat)) for g in groups]

    return oracle


def simulate(
    strategy: str,
    n_suspects: int,
    bad: int,
    goods: int,
    *,
    partners: int = 1,
    group_size: int = 2,
    noise: float = 0.0,
    seed: int = 0,
) -> tuple[Outcome, set[str]]:
    """One simulated run: *bad* of *n_suspects* suspects are bad; returns outcome and truth."""
    rng = random.Random(seed)
    suspects = [f"s{i:04d}" for i in range(n_suspects)]
    truth = set(rng.sample(suspects, bad))
    good_nodes = [f"g{i:03d}" for i in range(goods)]
    oracle = simulated_oracle(truth, noise=noise, rng=rng)
    return find_bad(
        strategy, suspects, good_nodes, oracle, group_size=group_size, partners=partners
    ), truth
