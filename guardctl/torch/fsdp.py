"""FSDP2 (``fully_shard``): the time each rank spends inside its collectives, for the probe.

FSDP gathers each unit's parameters before its forward and again in backward,
and every gather waits for the slowest rank: the waiting is spread over the
whole step, so no single ``comm_begin()`` separates a rank's own work from it.
:func:`instrument` times every all-gather and reduce-scatter of the FSDP units
instead (FSDP2's custom-communication hooks), and the probe counts the rest of
the step as the rank's compute::

    from guardctl import probe
    from guardctl.torch import fsdp

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    fsdp.instrument(model)          # every FSDP unit in it
    for x, y in loader:
        with probe.step(samples=len(x)):
            loss_fn(model(x), y).backward()
            optimizer.step()

On the host (CPU, gloo) a synchronous collective returns when it is done, so
its wall time is its time. With ``configure(cuda_events=True)`` the probe
records CUDA events on the current stream, which inside the hooks is FSDP's
all-gather or reduce-scatter stream. FSDP1 (``FullyShardedDataParallel``) has
no hook around its parameter all-gathers: see docs/telemetry.md. Needs a torch
whose ``FSDPModule`` has ``set_custom_all_gather`` (tested with 2.13).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

# FSDP2's communication protocols and its default collectives live in private
# modules in torch 2.13 (set_custom_all_gather's own annotations use them).
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)

from guardctl import probe

Size = Sequence[int | torch.SymInt]


class _TimedWork(dist.Work):
    """An asynchronous collective's handle: the host waits for it in ``wait()``, timed there.

    Only ``wait()`` is passed on: it is all FSDP calls on an all-gather's handle.
    """

    def __init__(self, inner: dist.Work, into: probe.Probe | None) -> None:
        super().__init__()
        self.inner = inner
        self.into = into

    def wait(self, timeout: Any = None) -> bool:
        with (self.into or probe).comm():
            return bool(self.inner.wait() if timeout is None else self.inner.wait(timeout))


class _Around:
    """What a timed collective shares: the wrapped one's buffers, and the probe it times into."""

    default: Any  # FSDP's own collective of the kind, what is wrapped without another

    def __init__(self, inner: Any = None, into: probe.Probe | None = None) -> None:
        self.inner = inner if inner is not None else self.default()
        self.into = into

    def allocate(self, size: Size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def _timed(self) -> Any:
        return (self.into or probe).comm()


class TimedAllGather(_Around, AllGather):
    """*inner* (an AllGather; default: FSDP's own), its time added to the probe's step."""

    default = DefaultAllGather

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        with self._timed():
            work = self.inner(output_tensor, input_tensor, group, async_op)
        # An explicit unshard(async_op=True) returns at once: the wait comes later.
        return _TimedWork(work, self.into) if work is not None else None


class TimedReduceScatter(_Around, ReduceScatter):
    """*inner* (a ReduceScatter; default: FSDP's own), its time added to the probe's step."""

    default = DefaultReduceScatter

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        with self._timed():
            return self.inner(output_tensor, input_tensor, group, op, async_op)


def instrument(
    module: nn.Module,
    *,
    all_gather: AllGather | None = None,
    reduce_scatter: ReduceScatter | None = None,
    into: probe.Probe | None = None,
) -> nn.Module:
    """Time the collectives of every FSDP2 unit in *module* (``fully_shard``-ed) and return it.

    *all_gather* and *reduce_scatter* are custom collectives to wrap (what you
    would give ``set_custom_all_gather`` / ``set_custom_reduce_scatter``);
    without them, FSDP's defaults. *into* is the probe (default: the module's).
    """
    if isinstance(module, FullyShardedDataParallel):
        raise TypeError(
            "guardctl.torch.fsdp.instrument: FSDP1 (FullyShardedDataParallel) has no hook "
            "around its parameter all-gathers; use fully_shard (docs/telemetry.md)"
        )
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        raise TypeError("guardctl.torch.fsdp.instrument: no fully_shard unit in the module")
    for unit in units:
        unit.set_custom_all_gather(TimedAllGather(all_gather, into))
        unit.set_custom_reduce_scatter(TimedReduceScatter(reduce_scatter, into))
    return module
