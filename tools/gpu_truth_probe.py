#!/usr/bin/env python3
"""GPU truth check for the probe's CUDA-event mode: its step times against the GPU's own.

For a GPU machine (not run in CI; needs torch with CUDA). A training rank's probe
with ``cuda_events=True`` times a step by events it records on the current stream;
this program checks on a real GPU that those times are right and that the training
loop never waits for them:

1. **marks**: steps of matrix products (the rank's own work) then a one-rank NCCL
   all-gather (its collective), marked with ``comm_begin()`` in half of the steps and
   ``with probe.comm():`` in the other half. Around the same work it records events of
   its own; the probe's ``step_s``, ``compute_s`` and ``comm_s``, as written to the
   store, must agree with them (within 1% or 50 us) in 95% of the steps.
2. **wall**: the same steps with the host synchronising before and after each one:
   the probe's ``step_s`` must agree with the host's clock (within 5% or 0.5 ms).
3. **no wait**: the loop that queues the steps, timed on the host, must run well ahead
   of the GPU (under half the GPU's time for them): a probe that synchronised would
   hold it back. Its per-step cost is set against the same loop without the probe.
4. **ddp**: a real DDP model on the GPU (one rank, NCCL) instrumented with
   ``guardctl.torch.instrument``: every step has a communication mark, and its
   ``step_s`` agrees with events around the step.

Prints a table and exits 0 when all checks pass, 1 when one fails, 2 when it cannot
run (no CUDA).

    python tools/gpu_truth_probe.py [--steps 40] [--size 8192] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guardctl import probe
from guardctl.identity import Identity
from guardctl.telemetry.schema import read_path

AGREE_FRACTION = 0.95
EVENT_TOL = (50e-6, 0.01)  # both sides are events on one stream: the same clock
WALL_TOL = (0.5e-3, 0.05)  # the host's clock also holds launch and wake-up latency
NO_WAIT_RATIO = 0.5


@dataclass(frozen=True)
class Truth:
    """One step as the checker measured it: step, compute and communication seconds."""

    step: int
    step_s: float
    compute_s: float
    comm_s: float


def within(tolerance: tuple[float, float]) -> Callable[[float, float], bool]:
    abs_tol, rel_tol = tolerance
    return lambda a, b: abs(a - b) <= max(abs_tol, rel_tol * max(abs(a), abs(b)))


def compare(
    check: str,
    truths: list[Truth],
    records: dict[int, dict[str, Any]],
    fields: tuple[str, ...],
    tolerance: tuple[float, float],
) -> list[dict[str, Any]]:
    """One row per field: how many steps' records agree with the checker's figures."""
    agrees = within(tolerance)
    rows = []
    for field in fields:
        pairs = [
            (float(records[t.step][field]), getattr(t, field)) for t in truths if t.step in records
        ]
        share = sum(agrees(a, b) for a, b in pairs) / len(pairs) if pairs else 0.0
        rows.append(
            {
                "check": check,
                "field": field,
                "steps": len(pairs),
                "agree": share,
                "probe_ms": 1e3 * statistics.median(a for a, _ in pairs) if pairs else None,
                "truth_ms": 1e3 * statistics.median(b for _, b in pairs) if pairs else None,
                "worst_us": 1e6 * max((abs(a - b) for a, b in pairs), default=0.0),
                "ok": bool(pairs) and share >= AGREE_FRACTION and len(pairs) == len(truths),
            }
        )
    return rows


def step_records(store: Path, job: str) -> dict[int, dict[str, Any]]:
    """The store's step records of *job*, by step number."""
    return {
        r["step"]: r
        for r in read_path(store).records
        if r["kind"] == "step" and r.get("job") == job
    }


class Rig:
    """The GPU work of a step: matrix products, then a one-rank all-gather.

    Out of place, so that NCCL copies the data even with one rank (an in-place
    all-reduce of one rank does nothing, and its time would say nothing).
    """

    def __init__(self, size: int, products: int, gather_mib: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        if not dist.is_initialized():
            dist.init_process_group(
                "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
        self.a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        self.grad = torch.randn(gather_mib * 2**18, device="cuda")  # float32: 4 bytes each
        self.out = torch.empty_like(self.grad)
        self.products = products
        for _ in range(3):  # cuBLAS and NCCL set up outside the timed steps
            self.compute()
            self.collective()
        torch.cuda.synchronize()

    def compute(self) -> None:
        for _ in range(self.products):
            self.a @ self.b

    def collective(self) -> None:
        self.dist.all_gather_into_tensor(self.out, self.grad)

    def event(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def seconds(start: Any, end: Any) -> float:
    # (Not the probe's own conversion: what the probe is checked against shares none of its code.)
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3


def run_marks(rig: Rig, one: probe.Probe, steps: int, first: int) -> list[Truth]:
    """Steps with the checker's events on either side of the probe's: the same instants."""
    marks = []
    for number in range(first, first + steps):
        e0 = rig.event()
        with one.step(number):
            rig.compute()
            ec = rig.event()
            if number % 2:
                one.comm_begin()
                rig.collective()
            else:
                with one.comm():
                    rig.collective()
            e1 = rig.event()
        marks.append((number, e0, ec, e1))
    return [Truth(n, seconds(e0, e1), seconds(e0, ec), seconds(ec, e1)) for n, e0, ec, e1 in marks]


def run_wall(rig: Rig, one: probe.Probe, steps: int, first: int) -> list[Truth]:
    """Steps between host synchronisations, timed on the host's clock."""
    truths = []
    for number in range(first, first + steps):
        rig.torch.cuda.synchronize()
        t0 = time.perf_counter()
        with one.step(number):
            rig.compute()
            one.comm_begin()
            rig.collective()
        rig.torch.cuda.synchronize()
        truths.append(Truth(number, time.perf_counter() - t0, 0.0, 0.0))
    return truths


def queue_time(rig: Rig, one: probe.Probe | None, steps: int, first: int) -> tuple[float, float]:
    """Host seconds to queue *steps* steps, and the GPU's seconds to run them."""
    rig.torch.cuda.synchronize()
    start = rig.event()
    t0 = time.perf_counter()
    for number in range(first, first + steps):
        if one is None:
            rig.compute()
            rig.collective()
            continue
        with one.step(number):
            rig.compute()
            one.comm_begin()
            rig.collective()
    host_s = time.perf_counter() - t0
    return host_s, seconds(start, rig.event())


def no_wait(rig: Rig, one: probe.Probe, steps: int, first: int) -> dict[str, Any]:
    bare_host, bare_gpu = queue_time(rig, None, steps, first)
    host, gpu = queue_time(rig, one, steps, first)
    return {
        "check": "no wait",
        "field": "host queue / GPU time",
        "steps": steps,
        "agree": host / gpu,
        "probe_ms": 1e3 * host / steps,
        "truth_ms": 1e3 * gpu / steps,
        "worst_us": None,
        "ok": host < NO_WAIT_RATIO * gpu,
        "probe_host_us": 1e6 * (host - bare_host) / steps,
        "bare_host_ms": 1e3 * bare_host / steps,
        "bare_gpu_ms": 1e3 * bare_gpu / steps,
        "note": f"the probe's host cost: {1e6 * (host - bare_host) / steps:+.1f} us a step",
    }


def run_ddp(store: Path, steps: int, width: int) -> tuple[list[Truth], dict[int, dict[str, Any]]]:
    """A one-rank DDP job on the GPU with guardctl.torch's hook: events around each step."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from guardctl import torch as guardctl_torch

    layers = [torch.nn.Linear(width, width) for _ in range(8)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).cuda(), device_ids=[0])
    one = guardctl_torch.configure(
        model, store=store, job="ddp", rank=0, node="truth", flush_interval_s=0.2
    )
    guardctl_torch.instrument(model, into=one)
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(4096, width, device="cuda")
    marks = []
    for number in range(steps):
        e0 = torch.cuda.Event(enable_timing=True)
        e0.record()
        with one.step(number, samples=len(batch)):
            optimiser.zero_grad()
            model(batch).square().mean().backward()
            optimiser.step()
        e1 = torch.cuda.Event(enable_timing=True)
        e1.record()
        marks.append((number, e0, e1))
    one.flush()
    truths = [Truth(n, seconds(e0, e1), 0.0, 0.0) for n, e0, e1 in marks]
    return truths[2:], step_records(store, "ddp")  # the first steps build DDP's buckets


def ddp_rows(truths: list[Truth], records: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = compare("ddp", truths, records, ("step_s",), EVENT_TOL)
    marked = [records[t.step] for t in truths if t.step in records]
    share = sum(r["comm_s"] > 0 for r in marked) / len(marked) if marked else 0.0
    rows.append(
        {
            "check": "ddp",
            "field": "comm_s > 0 (hook marked)",
            "steps": len(marked),
            "agree": share,
            "probe_ms": 1e3 * statistics.median(r["comm_s"] for r in marked) if marked else None,
            "truth_ms": None,
            "worst_us": None,
            "ok": bool(marked) and share == 1.0,
        }
    )
    return rows


def run(steps: int, size: int, products: int, gather_mib: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        rig = Rig(size, products, gather_mib)
        who = Identity(job="truth", rank=0, world=1, local_rank=0, node="truth")
        one = probe.Probe(who, store, cuda_events=True, flush_interval_s=0.2)
        marks = run_marks(rig, one, steps, 0)
        wall = run_wall(rig, one, steps, steps)
        one.flush()
        records = step_records(store, "truth")
        rows = compare("marks", marks, records, ("step_s", "compute_s", "comm_s"), EVENT_TOL)
        rows += compare("wall", wall, records, ("step_s",), WALL_TOL)
        rows.append(no_wait(rig, one, min(steps, 30), 2 * steps))
        rows += ddp_rows(*run_ddp(store, steps, 4096))
        rig.dist.destroy_process_group()
    return rows


def _cell(value: Any, scale: str) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.0f}%" if scale == "pct" else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--size", type=int, default=8192, help="matrix side (bf16)")
    parser.add_argument("--products", type=int, default=4, help="matrix products per step")
    parser.add_argument("--gather-mib", type=int, default=1024, help="all-gather size")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_truth_probe: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_truth_probe: CUDA is not available: run this on a GPU node", file=sys.stderr)
        return 2
    rows = run(args.steps, args.size, args.products, args.gather_mib)
    if args.json:
        print(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    else:
        from tabulate import tabulate

        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        print(
            tabulate(
                [
                    [
                        r["check"],
                        r["field"],
                        r["steps"],
                        _cell(r["agree"], "pct"),
                        _cell(r["probe_ms"], ""),
                        _cell(r["truth_ms"], ""),
                        _cell(r["worst_us"], ""),
                        "ok" if r["ok"] else "MISMATCH",
                        r.get("note", ""),
                    ]
                    for r in rows
                ],
                headers=[
                    "check",
                    "field",
                    "steps",
                    "agree",
                    "probe ms (median)",
                    "truth ms (median)",
                    "worst diff us",
                    "",
                    "",
                ],
            )
        )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
