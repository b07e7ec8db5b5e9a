#!/usr/bin/env python3
"""All-reduce bus bandwidth between the tasks of a Slurm job (inside a node or across nodes).

Run one task per GPU (or two per CPU-only node) under ``srun``. Backends:

- ``torch``: torch.distributed, NCCL on GPUs and gloo on CPUs;
- ``ring``: a numpy ring all-reduce (reduce-scatter then all-gather) over
  :mod:`multiprocessing.connection`, for nodes without torch.

(nccl-tests' ``all_reduce_perf`` is preferred by the job scripts when it is on
PATH; this program is the fallback.) Bandwidth is reported as nccl-tests
defines it: algbw = bytes / time, busbw = algbw * 2(n-1)/n, in GB/s (1e9).

Ranks meet through a rendezvous directory on the shared filesystem (each rank
writes its address there), authenticated with ``GUARDCTL_SWEEP_AUTHKEY``. Rank 0
prints JSON lines: ``allreduce_sample`` per message size and one
``allreduce_result``. On a node with GPUs (as gemm_burn.py tells) and no torch that
can use them, rank 0 prints a ``sweep_undetermined`` record ("no GPU backend") and
every rank exits 3: a CPU ring's figure would pass a GPU node.
``GUARDCTL_SWEEP_INJECT="node3=0.5"`` (on a lab cluster only, see
gemm_burn.py) slows the ranks on node3 so that the measured bandwidth drops (tests and demos).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_burn import NO_BACKEND, cpu_count, cpu_model, injected_factor, node_gpus, node_name


def env_int(*names: str, default: int) -> int:
    for name in names:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return default


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def wait_for(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"allreduce: no rendezvous file {path} after {timeout:g} s")
        time.sleep(0.05)
    return path.read_text(encoding="utf-8")


class Ring:
    """A ring of connections: this rank sends to rank+1 and receives from rank-1."""

    def __init__(
        self, rank: int, world: int, rendezvous: Path, bind: str, authkey: bytes, timeout: float
    ) -> None:
        self.rank, self.world = rank, world
        listener = Listener((bind, 0), authkey=authkey)
        host, port = listener.address
        me = {
            "rank": rank,
            "node": node_name(),
            "host": bind if bind != "0.0.0.0" else host,
            "port": port,
        }
        write_atomic(rendezvous / f"rank{rank}.json", json.dumps(me))
        peers = [json.loads(wait_for(rendezvous / f"rank{r}.json", timeout)) for r in range(world)]
        self.nodes = [p["node"] for p in peers]
        successor = peers[(rank + 1) % world]
        # accept() runs the auth handshake, so it must run while we connect onwards:
        # every rank connecting first would deadlock the ring.
        with ThreadPoolExecutor(1) as pool:
            accepted = pool.submit(listener.accept)
            self.next: Connection = Client((successor["host"], successor["port"]), authkey=authkey)
            self.prev: Connection = accepted.result(timeout=timeout)
        listener.close()
        self.sender = ThreadPoolExecutor(1)

    def _exchange(self, send: np.ndarray, into: np.ndarray) -> None:
        # Send in the background: both neighbours send at once and socket buffers are finite.
        pending = self.sender.submit(self.next.send_bytes, memoryview(send).cast("B"))
        got = self.prev.recv_bytes_into(memoryview(into).cast("B"))
        pending.result()
        if got != into.nbytes:
            raise SystemExit(f"allreduce: short message ({got} of {into.nbytes} bytes)")

    def allreduce(self, buf: np.ndarray) -> None:
        """Sum *buf* across the ring, in place."""
        n, r = self.world, self.rank
        chunks = np.array_split(buf, n)
        scratch = np.empty(max(c.size for c in chunks), dtype=buf.dtype)
        for step in range(n - 1):  # reduce-scatter
            s, d = (r - step) % n, (r - step - 1) % n
            tmp = scratch[: chunks[d].size]
            self._exchange(chunks[s], tmp)
            chunks[d] += tmp
        for step in range(n - 1):  # all-gather
            s, d = (r - step + 1) % n, (r - step) % n
            self._exchange(chunks[s], chunks[d])

    def close(self) -> None:
        self.sender.shutdown()
        self.next.close()
        self.prev.close()


def ring_backend(
    args: argparse.Namespace, rank: int, world: int
) -> tuple[Callable[[np.ndarray], None], list[str], str, Callable[[], None]]:
    key = os.environ.get("GUARDCTL_SWEEP_AUTHKEY", "")
    if not key:
        raise SystemExit("allreduce: GUARDCTL_SWEEP_AUTHKEY is not set")
    rendezvous = Path(args.rendezvous)
    rendezvous.mkdir(parents=True, exist_ok=True)
    ring = Ring(rank, world, rendezvous, args.bind, key.encode(), args.timeout)
    return ring.allreduce, ring.nodes, "numpy-ring", ring.close


def torch_backend(
    args: argparse.Namespace, rank: int, world: int
) -> tuple[Callable[[np.ndarray], None], list[str], str, Callable[[], None]]:
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available()
    local = env_int("SLURM_LOCALID", "LOCAL_RANK", default=0)
    if gpu:
        torch.cuda.set_device(local)
    store = Path(args.rendezvous) / "torch_store"
    # --timeout bounds the rendezvous (as the ring's) and each collective: a rank that never
    # comes fails the job in minutes instead of holding its nodes for torch's default 30.
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.timeout),
    )
    nodes: list[Any] = [None] * world
    dist.all_gather_object(nodes, node_name())
    device = torch.device("cuda", local) if gpu else torch.device("cpu")

    def allreduce(buf: np.ndarray) -> None:
        t = torch.from_numpy(buf).to(device)
        dist.all_reduce(t)
        if gpu:
            torch.cuda.synchronize()
        buf[:] = t.cpu().numpy()

    return (
        allreduce,
        [str(n) for n in nodes],
        "torch-nccl" if gpu else "torch-gloo",
        dist.destroy_process_group,
    )


def torch_gpus() -> str:
    """Empty when torch can use this node's GPUs, else why not."""
    try:
        import torch
    except ImportError as exc:
        return f"torch: {exc}"
    return "" if torch.cuda.is_available() else "torch: CUDA is not available"


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def measure(
    allreduce: Callable[[np.ndarray], None],
    size: int,
    world: int,
    rank: int,
    iters: int,
    warmup: int,
    factor: float,
) -> dict[str, Any]:
    count = max(world, size // 4)
    buf = np.empty(count, dtype=np.float32)
    nominal = float("inf")
    for _ in range(max(1, warmup)):
        buf.fill(rank + 1)
        t0 = time.perf_counter()
        allreduce(buf)
        nominal = min(nominal, time.perf_counter() - t0)
    times = []
    for _ in range(iters):
        buf.fill(rank + 1)
        t0 = time.perf_counter()
        allreduce(buf)
        if factor < 1.0:
            # A weak link, simulated by really taking longer; the others wait for it. The
            # delay comes from the un-injected warm-up: a rank's own time includes waiting
            # for the slow ranks, and scaling that would feed back between them.
            time.sleep(nominal * (1.0 / factor - 1.0))
        times.append(time.perf_counter() - t0)
    expected = world * (world + 1) / 2
    wrong = int(np.count_nonzero(buf != expected))
    seconds = statistics.median(times)
    nbytes = count * 4
    algbw = nbytes / seconds / 1e9
    return {
        "kind": "allreduce_sample",
        "size": nbytes,
        "count": count,
        "type": "float",
        "time_us": round(seconds * 1e6, 1),
        "algbw": round(algbw, 6),
        "busbw": round(algbw * 2 * (world - 1) / world, 6),
        "wrong": wrong,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rendezvous", required=True, help="shared directory for the ranks")
    parser.add_argument("--backend", choices=["auto", "torch", "ring"], default="auto")
    parser.add_argument("--min-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-bytes", type=int, default=16 << 20)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--bind",
        default=os.environ.get("GUARDCTL_SWEEP_BIND", ""),
        help="address to listen on (default: this host's address)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="rendezvous timeout (s); with torch, each collective's too",
    )
    args = parser.parse_args(argv)
    if not 0 < args.min_bytes <= args.max_bytes:
        parser.error("need 0 < --min-bytes <= --max-bytes")
    args.bind = args.bind or socket.gethostbyname(socket.gethostname())
    rank = env_int("SLURM_PROCID", "RANK", default=0)
    world = env_int("SLURM_NTASKS", "WORLD_SIZE", default=1)
    if world < 2:
        raise SystemExit("allreduce: needs at least 2 tasks (srun -n 2 or more)")
    backend = args.backend
    if backend == "auto":
        try:
            import torch.distributed

            backend = "torch"
        except ImportError:
            backend = "ring"
    factor = injected_factor(node_name())  # first: a refused test hook does nothing at all
    gpus = node_gpus()
    unusable = torch_gpus() if args.backend == "auto" and gpus else ""
    if unusable:
        if rank == 0:
            print(
                json.dumps(
                    {
                        "node": node_name(),
                        "kind": "sweep_undetermined",
                        "why": f"no GPU backend: the node has {gpus} GPU(s) and "
                        f"{sys.executable} cannot use them ({unusable})",
                    }
                ),
                flush=True,
            )
        return NO_BACKEND
    make = torch_backend if backend == "torch" else ring_backend
    allreduce, nodes, name, close = make(args, rank, world)
    results = []
    for size in sizes(args.min_bytes, args.max_bytes):
        sample = measure(allreduce, size, world, rank, args.iters, args.warmup, factor)
        results.append(sample)
        if rank == 0:
            print(json.dumps({"node": node_name(), **sample}), flush=True)
    close()
    if rank == 0:
        busbw = [r["busbw"] for r in results]
        device = f"cpu:{cpu_model()} x{cpu_count()}"
        if name == "torch-nccl":
            import torch

            device = torch.cuda.get_device_name()
        print(
            json.dumps(
                {
                    "node": node_name(),
                    "kind": "allreduce_result",
                    "backend": name,
                    "ranks": world,
                    "nodes": sorted(set(nodes)),
                    "device": device,
                    "busbw_avg": round(statistics.fmean(busbw), 6),
                    "busbw_peak": round(max(busbw), 6),
                    "wrong": sum(r["wrong"] for r in results),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
