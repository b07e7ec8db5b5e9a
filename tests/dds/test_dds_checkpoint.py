"""commit / restore across simulated crashes: the model sees each sample once per epoch."""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Callable

from dds_helpers import ServiceProcess

from guardctl.config import load_settings
from guardctl.dds import Client

Model = dict[int, list[int]]  # epoch -> the sample indices the model was trained on


def _client(
    service: ServiceProcess, worker: str, rank: int | None = None, world: int | None = None
) -> Client:
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    return Client(service.job, worker=worker, rank=rank, world=world, settings=settings, retry_s=30)


def _exactly_the_dataset(model: Model, records: int, epochs: int) -> None:
    assert sorted(model) == list(range(epochs))
    for epoch, samples in model.items():
        assert len(samples) == records, f"epoch {epoch}: {len(samples)} samples seen"
        assert sorted(samples) == list(range(records)), f"epoch {epoch} differs"


def test_pull_mode_commit_restore_across_crashes(
    start_service: Callable[..., ServiceProcess],
) -> None:
    records, epochs = 3000, 2
    service = start_service(
        "3001", "--records", str(records), "--shard-size", "25", "--epochs", str(epochs)
    )
    rng = random.Random(99)
    clients = [_client(service, f"w{i}") for i in range(3)]
    model: Model = {}
    saved: tuple[str, Model] | None = None
    crashes = service_kills = 0
    for round_ in range(10_000):
        shards = [c.lease() for c in clients]
        if all(s is None for s in shards):
            break
        if round_ % 7 == 6:  # a crash: the updates since the last checkpoint are lost
            crashes += 1
            if crashes % 2 == 0:
                service.kill()
                service.start(with_dataset=False)
                service_kills += 1
            assert saved is not None
            name, model = saved[0], copy.deepcopy(saved[1])
            clients = [_client(service, f"w{i}.{crashes}") for i in range(3)]
            clients[0].restore(name)
            continue
        for client, shard in zip(clients, shards, strict=True):
            if shard is not None and client.ack(shard):
                model.setdefault(shard.epoch, []).extend(range(shard.start, shard.end))
        if round_ % 5 == 4 or saved is None:  # a checkpoint: save the model, then commit
            saved = (f"ck{round_}", copy.deepcopy(model))
            clients[0].commit(saved[0])
        if rng.random() < 0.2:
            rng.shuffle(clients)
    assert crashes >= 5 and service_kills >= 2
    _exactly_the_dataset(model, records, epochs)


def test_per_step_commit_restore_across_crashes(
    start_service: Callable[..., ServiceProcess],
) -> None:
    records, epochs, world = 1000, 2, 3
    service = start_service(
        "3002",
        "--records",
        str(records),
        "--shard-size",
        "40",
        "--epochs",
        str(epochs),
        "--global-batch",
        "64",
    )
    ranks = [_client(service, f"r{r}", rank=r, world=world) for r in range(world)]
    model: Model = {}
    saved = ("start", 0, copy.deepcopy(model))
    ranks[0].commit("start", step=0)
    step = crashes = 0
    while True:
        batches = [c.next_batch(step, compute_s=0.01 * (r + 1)) for r, c in enumerate(ranks)]
        if batches[0] is None:
            break
        if step % 9 == 8 and crashes < 6:  # crash mid-step: back to the last checkpoint
            crashes += 1
            name, step, model = saved[0], saved[1], copy.deepcopy(saved[2])
            reply = ranks[0].restore(name)
            assert reply["step"] == step
            continue
        for batch in batches:
            assert batch is not None
            model.setdefault(batch.epoch, []).extend(batch.indices())
        step += 1
        if step % 4 == 0:
            saved = (f"ck{step}", step, copy.deepcopy(model))
            ranks[0].commit(saved[0], step=step)
    assert crashes == 6
    _exactly_the_dataset(model, records, epochs)
    counts = Counter(i for samples in model.values() for i in samples)
    assert set(counts.values()) == {epochs}
