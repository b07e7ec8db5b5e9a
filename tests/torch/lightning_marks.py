"""A 2-rank Lightning DDP job (run by torchrun, gloo) timed by guardctl's ProbeCallback.

Rank 1's forward is 3x slower; each rank writes its step records to the store given.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from guardctl import identity, probe
from guardctl.torch.lightning import ProbeCallback


class Model(LightningModule):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(self.delay)  # the rank's own work: a slow GPU, say
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    store = Path(sys.argv[1])
    who = identity.from_env()
    probe.configure(store=store)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32 * 30, 64), torch.randn(32 * 30, 1))
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=25,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ProbeCallback(samples=lambda batch: len(batch[0]))],
    )
    trainer.fit(Model(0.03 * (3 if who.rank == 1 else 1)), DataLoader(data, batch_size=32))
    probe.flush()


if __name__ == "__main__":
    main()
