"""A 2-rank Accelerate job on CPU (run by torchrun, gloo), timed with the probe.

``model = instrument(accelerator.prepare(model))``: the recipe of docs/telemetry.md.
Rank 1's forward is 3x slower; each rank writes its step records to the store given.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from slowness import Sleep  # this folder's, beside the script
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from guardctl import probe
from guardctl.torch import instrument


def main() -> None:
    accelerator = Accelerator(cpu=True)
    probe.configure(store=Path(sys.argv[1]))
    torch.manual_seed(0)
    delay = 0.03 * (3 if accelerator.process_index == 1 else 1)
    net = nn.Sequential(Sleep(delay), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(32 * 2 * 25, 64), torch.randn(32 * 2 * 25, 1))
    model, opt, loader = accelerator.prepare(net, opt, DataLoader(data, batch_size=32))
    assert isinstance(model, DistributedDataParallel), type(model)  # what the recipe relies on
    model = instrument(model)
    for x, y in loader:
        with probe.step(samples=len(x)):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)  # the hook marks comm_begin() inside
            opt.step()
    probe.flush()


if __name__ == "__main__":
    main()
