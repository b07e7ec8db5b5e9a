"""The probe's communication mark from inside DDP, where the rank really starts to wait.

DDP all-reduces gradient buckets while the backward pass still runs, and
``loss.backward()`` returns only after every bucket is reduced, so a
``comm_begin()`` after ``backward()`` counts the wait for the slowest rank as
every rank's compute and hides the straggler. DDP launches its buckets in
order, so the hook call for the last bucket comes when this rank's last
gradient is ready: its own work is done, whatever it does next is waiting.
:func:`timed_hook` marks that moment and hands the bucket to the real hook (the
default all-reduce, PowerSGD, a compression hook).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from guardctl import probe

CommHook = Callable[[Any, dist.GradBucket], "torch.futures.Future[torch.Tensor]"]


def timed_hook(hook: CommHook | None = None, into: probe.Probe | None = None) -> CommHook:
    """*hook* (default: DDP's all-reduce) with the probe's ``comm_begin`` at the last bucket.

    *into* is the probe to mark (default: the module's, :func:`guardctl.probe.configure`).
    """
    inner = hook if hook is not None else default_hooks.allreduce_hook

    @functools.wraps(inner)
    def marked(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            (into or probe).comm_begin()
        return inner(state, bucket)

    return marked


def instrument(
    model: DistributedDataParallel,
    hook: CommHook | None = None,
    state: Any = None,
    *,
    into: probe.Probe | None = None,
) -> DistributedDataParallel:
    """Register :func:`timed_hook` on a DDP *model* and return it.

    *hook* and *state* are what you would give ``register_comm_hook`` (e.g.
    ``powerSGD_hook`` and its ``PowerSGDState``); without them, DDP's default
    all-reduce over the model's process group. A model can have one hook only.
    """
    if not isinstance(model, DistributedDataParallel):
        raise TypeError("guardctl.torch.instrument: wrap the model in DistributedDataParallel")
    if hook is None:
        state = model.process_group if state is None else state
    model.register_comm_hook(state, timed_hook(hook, into))
    return model


def configure(model: torch.nn.Module | None = None, **options: Any) -> probe.Probe:
    """:func:`guardctl.probe.configure`, with CUDA-event timing when *model* lives on a GPU.

    On a GPU the marks are events on the current stream, so a step's times are
    the GPU's, not the moments the host queued the work; the probe's flush
    thread waits for them, never the training loop.
    """
    if "cuda_events" not in options and model is not None:
        options["cuda_events"] = any(p.is_cuda for p in model.parameters())
    return probe.configure(**options)
