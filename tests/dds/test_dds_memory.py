"""The ledger's containers: a split mapping that behaves as a dict, a queue over an array."""

from __future__ import annotations

import gc
from array import array

from hypothesis import given
from hypothesis import strategies as st

from guardctl.dds.memory import PARTS, ShardQueue, SplitDict

KEYS = st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=12))
OPS = st.lists(
    st.tuples(st.sampled_from(["set", "del", "pop", "pop_default", "get"]), KEYS, st.integers()),
    max_size=300,
)


@given(OPS)
def test_a_split_dict_answers_as_a_dict_does(ops: list[tuple[str, object, int]]) -> None:
    plain: dict[object, int] = {}
    split: SplitDict[object, int] = SplitDict()
    for op, key, value in ops:
        if op == "set":
            plain[key] = split[key] = value
        elif op == "get":
            assert split.get(key) == plain.get(key)
            assert split.get(key, -1) == plain.get(key, -1)
        elif op == "pop_default":
            assert split.pop(key, None) == plain.pop(key, None)
        elif key in plain:  # del and pop of a present key
            assert key in split
            if op == "del":
                del plain[key], split[key]
            else:
                assert split.pop(key) == plain.pop(key)
        else:
            assert key not in split
            for remove in (split.pop, split.__delitem__):
                try:
                    remove(key)
                except KeyError:
                    continue
                raise AssertionError(f"{op} of a missing key did not raise KeyError")
        assert len(split) == len(plain) and bool(split) == bool(plain)
    assert dict(split) == plain
    assert sorted(map(repr, split)) == sorted(map(repr, plain))
    assert split.key_set() == set(plain)


@given(st.lists(st.tuples(KEYS, st.integers()), max_size=300), OPS)
def test_a_filled_split_dict_is_the_dict_of_its_pairs(
    pairs: list[tuple[object, int]], ops: list[tuple[str, object, int]]
) -> None:
    """A load (fill) keeps the last value per key and counts each key once, whatever came
    before it, as ``dict.update`` does."""
    plain: dict[object, int] = {}
    split: SplitDict[object, int] = SplitDict()
    for _op, key, value in ops:
        plain[key] = split[key] = value
    plain.update(pairs)
    split.fill(pairs)
    assert dict(split) == plain and len(split) == len(plain)


def test_a_split_dict_spreads_lease_ids_and_request_ids_evenly() -> None:
    """Growth copies one part, so no part may hold much more than its share."""
    for keys in (range(1, 200_001), (f"{n:032x}" for n in range(200_000))):
        split: SplitDict[object, int] = SplitDict()
        for key in keys:
            split[key] = 1
        sizes = [len(part) for part in split.parts]
        assert sum(sizes) == 200_000
        assert max(sizes) < 2 * 200_000 / PARTS


def test_the_parts_of_int_maps_stay_out_of_the_collector() -> None:
    split: SplitDict[int, int] = SplitDict()
    for shard in range(10_000):
        split[shard] = shard + 7
    assert not any(gc.is_tracked(part) for part in split.parts)


def test_the_shard_queue_hands_out_requeued_shards_before_the_rest() -> None:
    queue = ShardQueue(array("q", [5, 3, 9]))
    assert queue and list(queue) == [5, 3, 9]
    assert queue.popleft() == 5
    queue.appendleft(5)
    queue.appendleft(8)
    assert list(queue) == [8, 5, 3, 9]
    assert [queue.popleft() for _ in range(4)] == [8, 5, 3, 9]
    assert not queue and list(queue) == []
