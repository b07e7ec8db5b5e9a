"""A layer that takes its time: a rank's own work (a slow GPU, say), for the job scripts."""

from __future__ import annotations

import time

import torch
from torch import nn


class Sleep(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)  # the rank's own work: a slow GPU, say
        return x
