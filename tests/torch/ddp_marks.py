"""A 2-rank gloo DDP job (run by torchrun) timing each step twice: the mark after backward()
and the mark from guardctl.torch's communication hook. Rank 1's forward is 3x slower."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from slowness import Sleep  # this folder's, beside the script
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from guardctl import identity, probe
from guardctl.torch import instrument


def main() -> None:
    out = Path(sys.argv[1])
    who = identity.from_env()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(
        Sleep(0.03 * (3 if who.rank == 1 else 1)),
        nn.Linear(64, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 1),
    )
    hooked = probe.Probe(who, out / f"hook{who.rank}")
    after = probe.Probe(who, out / f"after{who.rank}")
    model = instrument(DistributedDataParallel(net, bucket_cap_mb=0.05), into=hooked)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    times: dict[str, list[float]] = {"hook": [], "after": []}
    for _ in range(25):
        with hooked.step(), after.step():
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            after.comm_begin()  # the old recipe's place
            opt.step()
        for name, p in (("hook", hooked), ("after", after)):
            last = p.last()
            assert last is not None
            times[name].append(last.compute_s)
    medians = {name: statistics.median(v[5:]) for name, v in times.items()}
    (out / f"rank{who.rank}.json").write_text(json.dumps(medians))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
