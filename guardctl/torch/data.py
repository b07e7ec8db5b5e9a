"""DataLoader adapters for the data-sharding service: pull mode and per-step mode.

Pull mode (:class:`ShardDataset`): each DataLoader worker leases shards and
turns them into batches; the training process acknowledges a shard only once
the loop has come back for the batch after the shard's last one, that is after
training on it, so a rank killed mid-shard leaves it to be redone, never lost.
Ranks then see different numbers of batches: under synchronous DDP wrap the
loop in ``torch.distributed.algorithms.Join`` so the ranks that run out first
keep joining the others' all-reduces. Pull mode balances the work of
independent consumers; it cannot rebalance synchronous DDP, where every step
waits for the slowest rank anyway: that is what per-step mode is for.

Per-step mode (:class:`StepSampler`): a DataLoader ``batch_sampler`` whose
every item is this rank's share of one global step, split by the ranks'
measured speeds. It reports the probe's ``compute_s`` of the previous step (the
rank's own work, without the wait for the others; see
:func:`guardctl.torch.instrument`), and :meth:`StepSampler.take` gives the
loop the share's gradient scale.

guardctl's own errors at this boundary (no service for the job within
``dds.discover_timeout_s``, a request the service refuses, a secret it does not
accept) end the rank with one line ``guardctl: <reason>`` on stderr and the
error's exit code (2 refused request or no job id, 6 secret refused, 8 no
service): under torchrun a traceback from every rank would bury the reason.
Any other exception keeps its traceback.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info
from torch.utils.data.dataloader import default_collate

from guardctl import identity, probe
from guardctl.dds.client import Batch, Client, Shard
from guardctl.errors import GuardctlError


@contextlib.contextmanager
def ends_rank() -> Iterator[None]:
    """Turn guardctl's own errors into one line on stderr and the error's exit code."""
    try:
        yield
    except GuardctlError as exc:
        print(f"guardctl: {_reason(exc)}", file=sys.stderr, flush=True)
        raise SystemExit(int(exc.exit_code)) from None


def _reason(exc: GuardctlError) -> str:
    """The error's message; from a DataLoader worker, the last line of the worker's report."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    name = f"{type(exc).__module__}.{type(exc).__qualname__}: "
    return lines[-1].removeprefix(name)


def _client(options: dict[str, Any], worker_suffix: str = "") -> Client:
    options = dict(options)
    if worker_suffix and "worker" not in options:
        options["worker"] = identity.from_env().worker + worker_suffix
    return Client(**options)


class ShardDataset(IterableDataset[tuple[Any, Shard, bool]]):
    """Pull mode: batches of leased shards, acknowledged after training (see the module).

    *samples* maps a global record index to a sample (a map-style dataset);
    each batch holds up to *batch_size* records of one shard, collated by
    *collate_fn*. *client_options* go to :class:`guardctl.dds.Client` (job,
    address, secret, settings); each DataLoader worker opens its own client.
    Iterate :meth:`trained` (over a DataLoader of this dataset built with
    ``batch_size=None``, or over the dataset itself), not the loader.
    """

    def __init__(
        self,
        samples: Dataset[Any],
        batch_size: int,
        *,
        collate_fn: Callable[[list[Any]], Any] = default_collate,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("ShardDataset: batch_size must be >= 1")
        self.samples = samples
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.client_options = dict(client_options or {})
        self.counted = 0  # shards whose completion counted (in the training process)
        self.not_counted = 0  # acknowledged but already done or revoked elsewhere

    def __iter__(self) -> Iterator[tuple[Any, Shard, bool]]:
        info = get_worker_info()
        client = _client(self.client_options, f".w{info.id}" if info is not None else "")
        try:
            while (shard := client.lease()) is not None:
                # Renewed here while its batches are made; the training process
                # renews it from its first batch until it acknowledges it.
                with client.renewing(shard):
                    yield from self._batches(shard)
        finally:
            client.close()

    def _batches(self, shard: Shard) -> Iterator[tuple[Any, Shard, bool]]:
        for lo in range(shard.start, shard.end, self.batch_size):
            hi = min(lo + self.batch_size, shard.end)
            batch = self.collate_fn([self.samples[i] for i in range(lo, hi)])
            yield batch, shard, hi == shard.end

    def trained(self, loader: Iterable[tuple[Any, Shard, bool]] | None = None) -> Iterator[Any]:
        """The batches of *loader* (default: this dataset, in this process), acknowledging
        each shard when the loop asks for the batch after its last one."""
        with ends_rank():
            yield from self._trained(loader)

    def _trained(self, loader: Iterable[tuple[Any, Shard, bool]] | None) -> Iterator[Any]:
        client = _client(self.client_options)
        held: dict[int, Shard] = {}
        stop = threading.Event()
        renewer = threading.Thread(
            target=self._renew, args=(client, held, stop), daemon=True, name="guardctl-dds-renew"
        )
        renewer.start()
        try:
            for batch, shard, last in loader if loader is not None else self:
                held.setdefault(shard.lease, shard)
                yield batch  # the loop trains on it before it asks for the next one
                if last:
                    held.pop(shard.lease, None)
                    if client.ack(shard):
                        self.counted += 1
                    else:
                        self.not_counted += 1
        finally:
            stop.set()
            renewer.join()
            client.close()

    @staticmethod
    def _renew(client: Client, held: dict[int, Shard], stop: threading.Event) -> None:
        period = client.settings.dds.lease_s / 3
        while not stop.wait(period):
            for shard in list(held.values()):
                with contextlib.suppress(GuardctlError):  # restarting: try again next round
                    client.renew(shard)


@dataclass(frozen=True)
class StepShare:
    """This rank's part of one global step, as the loop needs it."""

    step: int
    epoch: int
    share: int  # samples of this rank in the step (0: one padding sample, scale 0)
    batch: int  # the step's global batch
    scale: float  # factor for a sum-reduced loss: DDP's average is then the global mean

    @classmethod
    def of(cls, batch: Batch, world: int) -> StepShare:
        scale = batch.scale(world) if batch.share else 0.0
        return cls(batch.step, batch.epoch, batch.share, batch.batch, scale)


class StepSampler(Sampler[list[int]]):
    """Per-step mode as a DataLoader ``batch_sampler`` (see the module).

    Each item is the global record indices of this rank's share of one step;
    a rank whose share is zero gets *padding_index* alone with scale 0, so that
    it still runs the step's forward and backward (DDP's all-reduce needs every
    rank) and adds nothing to the gradient. Call :meth:`take` once per batch
    the loop receives, in order.
    """

    def __init__(
        self,
        client: Client | None = None,
        *,
        first_step: int = 0,
        padding_index: int = 0,
        compute_s: Callable[[], float | None] | None = None,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if client is None:
            with ends_rank():
                client = _client(client_options or {})
        self.client = client
        self.step = first_step
        self.padding_index = padding_index
        self._compute_s = compute_s if compute_s is not None else _probe_compute_s
        self._given: collections.deque[StepShare] = collections.deque()

    def __iter__(self) -> Iterator[list[int]]:
        with ends_rank():
            yield from self._steps()

    def _steps(self) -> Iterator[list[int]]:
        while True:
            batch = self.client.next_batch(self.step, compute_s=self._compute_s())
            if batch is None:
                return
            self._given.append(StepShare.of(batch, self.client.world))
            self.step += 1
            yield list(batch.indices()) or [self.padding_index]

    def take(self) -> StepShare:
        """The share of the oldest batch handed out and not yet taken (the loop's current one)."""
        return self._given.popleft()


def _probe_compute_s() -> float | None:
    last = probe.last()
    return last.compute_s if last is not None else None
