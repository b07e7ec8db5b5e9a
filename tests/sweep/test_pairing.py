"""Pairing strategies find the injected bad nodes among many suspects, in few rounds."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guardctl.sweep import pairing


@pytest.mark.parametrize("strategy", sorted(pairing.STRATEGIES))
@pytest.mark.parametrize(("suspects", "bad", "goods"), [(64, 3, 2), (200, 6, 4), (9, 2, 1)])
def test_finds_exactly_the_bad_nodes(strategy: str, suspects: int, bad: int, goods: int) -> None:
    outcome, truth = pairing.simulate(strategy, suspects, bad, goods, seed=7)
    assert outcome.bad == truth
    assert outcome.cleared | outcome.bad == {f"s{i:04d}" for i in range(suspects)}
    assert not outcome.undetermined


def test_regroup_needs_few_rounds_where_one_vs_good_needs_many() -> None:
    regroup, _ = pairing.simulate("regroup", 128, 4, 2, seed=1)
    naive, _ = pairing.simulate("one_vs_good", 128, 4, 2, seed=1)
    two, _ = pairing.simulate("two_round", 128, 4, 2, seed=1)
    assert regroup.rounds == 2
    assert naive.rounds == 64
    assert two.rounds > regroup.rounds  # two goods cannot isolate 8 members in one round


def test_every_round_uses_a_node_at_most_once() -> None:
    outcome, _ = pairing.simulate("regroup", 50, 5, 3, seed=3)
    for rnd in outcome.history:
        members = [n for group, _ in rnd for n in group]
        assert len(members) == len(set(members))


def test_a_bad_node_is_only_declared_bad_alone_with_cleared_partners() -> None:
    outcome, _truth = pairing.simulate("regroup", 40, 4, 2, seed=5)
    for node in outcome.bad:
        proofs = [
            g
            for rnd in outcome.history
            for g, ok in rnd
            if not ok
            and g[0] == node
            and all(p in outcome.cleared or p.startswith("g") for p in g[1:])
        ]
        assert proofs, node


def test_no_good_partner_and_all_failing_leaves_them_undetermined() -> None:
    outcome = pairing.find_bad(
        "regroup", ["a", "b", "c", "d"], [], lambda groups: [False] * len(groups)
    )
    assert outcome.undetermined == {"a", "b", "c", "d"} and not outcome.bad


def test_repeat_once_masks_transient_noise() -> None:
    rng = random.Random(11)
    truth = {"s0003"}
    oracle = pairing.simulated_oracle(truth, noise=0.1, rng=rng, repeat=1)
    suspects = [f"s{i:04d}" for i in range(60)]
    outcome = pairing.find_bad("regroup", suspects, ["g0", "g1"], oracle)
    assert truth <= outcome.bad
    assert len(outcome.bad) <= 3  # a false failure needs two noisy draws in a row


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 60),
    bad=st.integers(0, 8),
    goods=st.integers(1, 4),
    size=st.integers(2, 5),
    seed=st.integers(0, 1000),
)
def test_regroup_is_exact_without_noise(n: int, bad: int, goods: int, size: int, seed: int) -> None:
    bad = min(bad, n)
    rng = random.Random(seed)
    suspects = [f"s{i}" for i in range(n)]
    truth = set(rng.sample(suspects, bad))
    outcome = pairing.find_bad(
        "regroup",
        suspects,
        [f"g{i}" for i in range(goods)],
        pairing.simulated_oracle(truth),
        group_size=size,
    )
    assert outcome.bad == truth and not outcome.undetermined
