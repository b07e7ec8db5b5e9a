"""PyTorch integration: where a rank's gradient communication starts, and DataLoader adapters.

The only part of guardctl that imports torch (``pip install guardctl[torch]``)::

    from guardctl import probe
    from guardctl.torch import instrument, StepSampler

    model = instrument(DistributedDataParallel(net))  # marks comm_begin from DDP's hook
    sampler = StepSampler()  # per-step mode of the data-sharding service
    for batch in DataLoader(data, batch_sampler=sampler):
        share = sampler.take()
        with probe.step(samples=share.share):
            loss = loss_fn(model(batch[0]), batch[1], reduction="sum") * share.scale
            loss.backward()                               # the hook calls probe.comm_begin()
            optimizer.step()

See docs/telemetry.md and docs/dds.md for why the mark must come from the hook.
Lightning jobs: :class:`guardctl.torch.lightning.ProbeCallback` (imported from
there only, so that this package does not need Lightning). FSDP2 jobs:
:func:`guardctl.torch.fsdp.instrument` (``from guardctl.torch import fsdp``; not
imported here, as loading FSDP takes about half a second).
"""

from __future__ import annotations

from guardctl.torch.data import ShardDataset, StepSampler, StepShare
from guardctl.torch.hooks import configure, instrument, timed_hook

__all__ = ["ShardDataset", "StepSampler", "StepShare", "configure", "instrument", "timed_hook"]
