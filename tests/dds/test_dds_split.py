"""The per-step split: proportional to measured speed, always the whole global batch."""

from __future__ import annotations

from collections.abc import Callable

from dds_helpers import ServiceProcess
from hypothesis import given
from hypothesis import strategies as st

from guardctl.config import load_settings
from guardctl.dds import Client
from guardctl.dds.split import ewma, rank_speeds, split_batch


@given(
    st.integers(min_value=0, max_value=100_000),
    st.lists(st.floats(min_value=0.01, max_value=1e6), min_size=1, max_size=64),
)
def test_split_sums_to_the_batch_and_is_within_one_of_proportional(
    batch: int, speeds: list[float]
) -> None:
    shares = split_batch(batch, speeds)
    assert sum(shares) == batch and min(shares) >= 0
    total = sum(speeds)
    for share, speed in zip(shares, speeds, strict=True):
        assert abs(share - batch * speed / total) < 1.0 + 1e-9


def test_split_examples() -> None:
    assert split_batch(1024, [1.0, 1.0, 1.0, 0.25]) == [315, 315, 315, 79]
    assert split_batch(10, [1, 1, 1]) == [4, 3, 3]
    assert split_batch(3, [0.0, 0.0, 0.0]) == [1, 1, 1]
    assert rank_speeds(3, {0: 10.0, 2: 30.0}) == [10.0, 20.0, 30.0]
    assert ewma(None, 5.0, 4) == 5.0
    assert 5.0 < ewma(5.0, 10.0, 1) == 7.5


def test_the_service_splits_steps_by_the_speeds_the_ranks_report(
    start_service: Callable[..., ServiceProcess],
) -> None:
    """Four ranks, rank 3 four times slower: its share falls to about a 13th of the batch."""
    world, batch = 4, 1024
    service = start_service(
        "4001", "--records", "200000", "--shard-size", "500", "--global-batch", str(batch)
    )
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    ranks = [
        Client(service.job, worker=f"rank{r}", rank=r, world=world, settings=settings)
        for r in range(world)
    ]
    per_sample_s = [0.001, 0.001, 0.001, 0.004]  # what each rank really needs per sample
    shares = [0] * world
    for step in range(12):
        parts = []
        for r, client in enumerate(ranks):
            compute_s = shares[r] * per_sample_s[r] if step else None
            part = client.next_batch(step, compute_s=compute_s)
            assert part is not None
            parts.append(part)
        shares = [p.share for p in parts]
        assert sum(shares) == batch
        assert abs(sum(p.weight for p in parts) - 1.0) < 1e-9
        covered = sorted(i for p in parts for i in p.indices())
        assert len(covered) == len(set(covered)) == batch  # the ranks' parts do not overlap
    expected = split_batch(batch, [1 / s for s in per_sample_s])
    assert all(abs(a - b) <= 2 for a, b in zip(shares, expected, strict=True)), shares
    # every rank's part now takes about the same time
    times = [share * s for share, s in zip(shares, per_sample_s, strict=True)]
    assert max(times) / min(times) < 1.05
