"""DataLoader adapters against a real data-sharding service process."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from dds_helpers import ServiceProcess, done_counts  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from guardctl.config import load_settings  # noqa: E402
from guardctl.torch import ShardDataset, StepSampler  # noqa: E402

RECORDS, SHARD, BATCH = 2048, 256, 64


def options(svc: ServiceProcess) -> dict[str, object]:
    settings = load_settings(assignments=(f"store.root={svc.store}", "dds.lease_s=2"), environ={})
    return {"job": svc.job, "settings": settings}


def test_pull_mode_acknowledges_a_shard_only_after_training_on_it(
    service: Callable[..., ServiceProcess],
) -> None:
    svc = service("pull", "--records", str(RECORDS), "--shard-size", str(SHARD), "--no-shuffle")
    data = TensorDataset(torch.arange(RECORDS))
    first = ShardDataset(data, BATCH, client_options=options(svc))
    trained: Counter[int] = Counter()
    loader = DataLoader(first, batch_size=None, num_workers=2)
    for n, (batch,) in enumerate(first.trained(loader)):
        shard = int(batch[0]) // SHARD
        assert (0, shard) not in done_counts(svc), "acknowledged before it was trained on"
        trained.update(batch.tolist())
        if n == 9:
            break  # this rank dies: the shard it was in the middle of goes to another
    assert first.counted == 2  # 10 batches: two whole shards, half of a third
    second = ShardDataset(data, BATCH, client_options=options(svc))
    for (batch,) in second.trained():
        trained.update(batch.tolist())
    assert done_counts(svc) == {(0, s): 1 for s in range(RECORDS // SHARD)}
    assert set(trained) == set(range(RECORDS))
    # What the first rank trained on without acknowledging was trained on again, no more.
    assert sum(trained.values()) - RECORDS == 2 * BATCH  # one batch of each worker's shard


def test_per_step_sampler_gives_the_share_and_its_scale(
    service: Callable[..., ServiceProcess],
) -> None:
    svc = service("steps", "--records", "512", "--shard-size", "64", "--global-batch", "64")
    data = TensorDataset(torch.arange(512))
    sampler = StepSampler(
        client_options={**options(svc), "rank": 0, "world": 1}, compute_s=lambda: 0.01
    )
    seen = []
    for (batch,) in DataLoader(data, batch_sampler=sampler):
        share = sampler.take()
        assert share.share == len(batch) == 64 and share.scale == pytest.approx(1 / 64)
        seen += batch.tolist()
    assert sorted(seen) == list(range(512))
