"""A 3-rank gloo FSDP2 job (run by torchrun) timed twice in the same steps: with
guardctl.torch.fsdp's timed collectives, and with one mark after backward(); then
steps with an explicit asynchronous unshard. One unit of rank 2 is slow in its
forward; each rank writes each probe's records."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from slowness import Sleep  # this folder's, beside the script
from torch import nn
from torch.distributed.fsdp import fully_shard

from guardctl import identity, probe
from guardctl.torch import fsdp


def block(delay: float) -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), Sleep(delay), nn.ReLU(), nn.Linear(64, 64))


def main() -> None:
    out = Path(sys.argv[1])
    who = identity.from_env()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    delay = 0.08 if who.rank == 2 else 0.02
    model = nn.Sequential(block(0.0), block(delay), block(0.0), nn.Linear(64, 1))
    for unit in model[:3]:
        fully_shard(unit)
    fully_shard(model)  # the root unit: the last Linear
    timed = probe.Probe(who, out / "timed")
    after = probe.Probe(who, out / "after")
    fsdp.instrument(model, into=timed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    for _ in range(25):
        with timed.step(samples=32), after.step(samples=32):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            after.comm_begin()  # the only single mark there is: after every gather
            opt.step()
    # An explicit asynchronous unshard: the host waits in the handle's wait(), timed there.
    prefetched = probe.Probe(who, out / "async")
    fsdp.instrument(model, into=prefetched)
    for _ in range(15):
        with prefetched.step(samples=32):
            time.sleep(0.1 if who.rank == 2 else 0.0)  # rank 2 gathers late: the others wait
            model[0].unshard(async_op=True).wait()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    for each in (timed, after, prefetched):
        each.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
