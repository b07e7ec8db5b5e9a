#!/usr/bin/env python3
"""A stand-in training rank that takes its data from the job's data-sharding service.

It "trains" by sleeping ``--sample-ms`` per sample (times ``--slow``, to play a
straggler) and can log every sample it trained on, which is how the tests and
the demo check that each sample was seen exactly once. Replace the sleep with
a real forward/backward pass; the guardctl.dds calls stay the same.

  pull mode:      python3 examples/dds_train.py --mode pull
  per-step mode:  python3 examples/dds_train.py --mode step --rank R --world W

Job id, address and secret come from the job's environment and the store
(SLURM_JOB_ID, GUARDCTL_STORE or /etc/guardctl).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from guardctl.dds import Client


def _log(out: TextIO | None, record: dict[str, object]) -> None:
    if out is not None:
        out.write(json.dumps(record) + "\n")
        out.flush()


def train_pull(client: Client, per_sample_s: float, out: TextIO | None) -> int:
    """Lease shards until none are left; return how many of our completions counted."""
    counted = 0
    shard = client.lease()
    while shard is not None:
        with client.renewing(shard):
            time.sleep(len(shard) * per_sample_s)  # the forward/backward pass
        done, following = client.ack_and_lease(shard)  # one round trip for both
        if done:
            # Only a completion that counted may update the model (see docs/dds.md).
            counted += 1
            _log(
                out,
                {
                    "epoch": shard.epoch,
                    "shard": shard.shard,
                    "start": shard.start,
                    "end": shard.end,
                },
            )
        shard = following
    return counted


def train_steps(client: Client, per_sample_s: float, out: TextIO | None, first: int) -> int:
    """Run synchronous steps with this rank's speed-proportional share; return steps run."""
    step, compute_s = first, None
    while (batch := client.next_batch(step, compute_s=compute_s)) is not None:
        started = time.perf_counter()
        time.sleep(batch.share * per_sample_s)  # forward/backward on batch.indices()
        compute_s = time.perf_counter() - started
        # The gradient of this rank is scaled by batch.weight before the all-reduce.
        _log(
            out,
            {
                "step": batch.step,
                "epoch": batch.epoch,
                "share": batch.share,
                "weight": batch.weight,
                "ranges": batch.ranges,
            },
        )
        step += 1
    return step - first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job id [default: $SLURM_JOB_ID]")
    parser.add_argument("--mode", choices=["pull", "step"], default="pull")
    parser.add_argument("--rank", type=int, help="[default: $SLURM_PROCID]")
    parser.add_argument("--world", type=int, help="[default: $SLURM_NTASKS]")
    parser.add_argument("--first-step", type=int, default=0)
    parser.add_argument("--sample-ms", type=float, default=0.05, help="work per sample")
    parser.add_argument("--slow", type=float, default=1.0, help="slow-down factor (straggler)")
    parser.add_argument("--log", help="append what was trained on to this JSON Lines file")
    args = parser.parse_args(argv)
    per_sample_s = args.sample_ms / 1000.0 * args.slow
    client = Client(args.job, rank=args.rank, world=args.world)
    out = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115
    try:
        if args.mode == "pull":
            done = train_pull(client, per_sample_s, out)
            print(f"{client.worker}: {done} shards counted", file=sys.stderr)
        else:
            done = train_steps(client, per_sample_s, out, args.first_step)
            print(f"{client.worker}: {done} steps", file=sys.stderr)
    finally:
        if out is not None:
            out.close()
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
