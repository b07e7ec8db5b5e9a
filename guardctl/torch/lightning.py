"""Lightning: the probe around every training batch, and the DDP mark, as one callback.

``pip install guardctl[lightning]``; imports ``lightning.pytorch`` (the
``lightning`` package, not the older ``pytorch_lightning``)::

    from guardctl.torch.lightning import ProbeCallback

    trainer = Trainer(strategy="ddp", callbacks=[ProbeCallback(samples=lambda b: len(b[0]))])

Under DDP the callback registers :func:`guardctl.torch.instrument`'s hook on the
wrapped model once the strategy has wrapped it, so ``compute_s`` is the rank's
own work (docs/telemetry.md). DDP takes one communication hook: give another
hook (PowerSGD, say) to the callback, not to ``DDPStrategy(ddp_comm_hook=...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from torch.nn.parallel import DistributedDataParallel

from guardctl import probe
from guardctl.torch.hooks import CommHook, instrument


class ProbeCallback(Callback):
    """Times each training batch with the probe (one step record per batch).

    *samples* maps a batch to the work it is (samples, or tokens); without it,
    steps carry no sample count. *hook* and *state* are the DDP communication
    hook to wrap (default: DDP's all-reduce); *into* the probe to use (default:
    the module's, :func:`guardctl.probe.configure`).
    """

    def __init__(
        self,
        samples: Callable[[Any], int] | None = None,
        hook: CommHook | None = None,
        state: Any = None,
        *,
        into: probe.Probe | None = None,
    ) -> None:
        self.samples = samples
        self.hook = hook
        self.state = state
        self.into = into
        self._open: probe.Probe | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        model = trainer.strategy.model
        if isinstance(model, DistributedDataParallel):
            instrument(model, self.hook, self.state, into=self.into)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        count = self.samples(batch) if self.samples is not None else None
        self._open = (self.into or probe).step(samples=count)
        self._open.__enter__()

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        opened, self._open = self._open, None
        if opened is not None:
            opened.__exit__(None, None, None)
