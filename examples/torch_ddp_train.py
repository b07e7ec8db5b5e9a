#!/usr/bin/env python3
"""A real PyTorch DDP training job (CPU, gloo) that takes its data from the data-sharding service.

A small MLP learns a fixed linear map from synthetic records (record i is the
same on every rank: the dataset is generated from a seed). The probe times
every step, marked from DDP's communication hook (guardctl.torch.instrument),
and per-step mode gives each rank a share of the global batch by its speed.
``--slow-rank R --slow F`` plays a straggler: rank R's forward pass sleeps F
times as long per sample as the others' (the others sleep ``--sample-ms``).

  per-step mode:  torchrun --nproc-per-node 4 examples/torch_ddp_train.py --mode step
  pull mode:      torchrun --nproc-per-node 4 examples/torch_ddp_train.py --mode pull

Rank and world come from torchrun, or from Slurm under srun (then MASTER_ADDR
and MASTER_PORT must be set, as examples/torch_ddp_job.sbatch does); the
service's job from GUARDCTL_JOB or SLURM_JOB_ID. ``--out DIR`` writes what each
rank trained on and the loss before and after training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from guardctl import identity, probe
from guardctl.torch import ShardDataset, StepSampler, configure, instrument

FEATURES = 16


def synthetic(records: int, seed: int) -> TensorDataset:
    """Records (x, y, index) with y a fixed linear map of x plus a little noise."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(records, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    y = x @ w + 0.01 * torch.randn(records, 1, generator=gen)
    return TensorDataset(x, y, torch.arange(records))


class Slowness(nn.Module):
    """Sleeps per sample in the forward pass: the rank's compute speed, made explicit."""

    def __init__(self, per_sample_s: float) -> None:
        super().__init__()
        self.per_sample_s = per_sample_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.per_sample_s * x.shape[0])
        return x


def build_model(per_sample_s: float) -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(
        Slowness(per_sample_s), nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1)
    )


def evaluate(model: nn.Module, data: TensorDataset) -> float:
    x, y, _ = data[: min(len(data), 2048)]
    with torch.no_grad():
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        return float(nn.functional.mse_loss(inner[1:](x), y))


def train_steps(
    model: DistributedDataParallel, data: TensorDataset, opt: torch.optim.Optimizer, log: Any
) -> int:
    """Per-step mode: this rank's share of each global step, its gradient scaled to match."""
    sampler = StepSampler()
    steps = 0
    for x, y, index in DataLoader(data, batch_sampler=sampler):
        share = sampler.take()
        with probe.step(share.step, samples=share.share):
            # Sum over the share times world/global batch: DDP's average is the global mean,
            # and a rank with a zero share (one padding sample, scale 0) adds nothing.
            loss = nn.functional.mse_loss(model(x), y, reduction="sum") * share.scale
            opt.zero_grad()
            loss.backward()  # the communication hook marks probe.comm_begin() inside
            opt.step()
        if share.share:
            log(
                {
                    "step": share.step,
                    "epoch": share.epoch,
                    "share": share.share,
                    "batch": share.batch,
                    "indices": index.tolist(),
                }
            )
        steps += 1
    return steps


def train_pull(
    model: DistributedDataParallel,
    data: TensorDataset,
    opt: torch.optim.Optimizer,
    log: Any,
    batch_size: int,
    workers: int,
) -> int:
    """Pull mode: shards on demand; Join keeps DDP going when ranks run out unevenly."""
    shards = ShardDataset(data, batch_size)
    loader = DataLoader(shards, batch_size=None, num_workers=workers)
    steps = 0
    with Join([model]):
        for x, y, index in shards.trained(loader):
            with probe.step(samples=len(index)):
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            log({"indices": index.tolist()})
            steps += 1
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["step", "pull"], default="step")
    parser.add_argument("--records", type=int, default=int(os.environ.get("DDS_RECORDS", 8192)))
    parser.add_argument("--seed", type=int, default=0, help="of the synthetic dataset")
    parser.add_argument("--sample-ms", type=float, default=0.2, help="forward time per sample")
    parser.add_argument("--slow-rank", type=int, action="append", default=[])
    parser.add_argument("--slow", type=float, default=3.0, help="the slow ranks' factor")
    parser.add_argument("--batch", type=int, default=32, help="pull mode: batch size")
    parser.add_argument("--workers", type=int, default=0, help="pull mode: DataLoader workers")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, help="directory for what each rank trained on")
    args = parser.parse_args(argv)

    who = identity.from_env()
    dist.init_process_group("gloo", rank=who.rank, world_size=who.world)
    slow = args.slow if who.rank in args.slow_rank else 1.0
    data = synthetic(args.records, args.seed)
    net = build_model(args.sample_ms / 1000.0 * slow)
    configure(net)  # the probe; CUDA-event timing if the model were on a GPU
    model = instrument(DistributedDataParallel(net))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    out = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = open(args.out / f"rank{who.rank}.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def log(record: dict[str, Any]) -> None:
        if out is not None:
            out.write(json.dumps(record) + "\n")

    before = evaluate(model, data)
    started = time.monotonic()
    if args.mode == "step":
        steps = train_steps(model, data, opt, log)
    else:
        steps = train_pull(model, data, opt, log, args.batch, args.workers)
    after = evaluate(model, data)
    log(
        {
            "rank": who.rank,
            "node": who.node,
            "steps": steps,
            "loss_before": before,
            "loss_after": after,
            "seconds": time.monotonic() - started,
        }
    )
    if out is not None:
        out.close()
    print(f"rank {who.rank}: {steps} steps, loss {before:.4f} -> {after:.4f}", file=sys.stderr)
    probe.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
