#!/usr/bin/env python3
"""GEMM burn-in: keep every GPU (or the CPU) multiplying matrices and report TFLOP/s over time.

Some GPUs slow down only once they are hot, so the burn-in runs for minutes and
reports a figure per interval; the *sustained* figure (median of the second
half of the run) is what a sweep judges. Backends: torch (CUDA), cupy, and
numpy on CPU-only nodes so that the whole path also runs on a test cluster.

A node with GPUs (guardctl's ``GUARDCTL_NODE_GPUS`` from Slurm's Gres, Slurm's
``SLURM_GPUS_ON_NODE``, or the NVIDIA driver's files) is never burnt on its CPU:
without a usable torch or cupy the program prints a ``sweep_undetermined``
record ("no GPU backend") and exits 3, and the sweep is undetermined, not a
pass. ``--backend numpy`` asks for the CPU on purpose.

Output: JSON lines on stdout, ``gemm_sample`` per interval and ``gemm_result``
per device at the end. Standalone on purpose (only numpy/torch/cupy): it runs
inside Slurm jobs and on machines without guardctl.

Fault injection for tests and demos: ``GUARDCTL_SWEEP_INJECT="node3=0.5"``
makes this program, when running on node3 (``SLURMD_NODENAME``), idle after
each multiply so that its real measured rate drops to 0.5 of normal. It is
honoured only on a local lab cluster (guardctl.testhooks decides, from the
slurm.conf in use); anywhere else the program refuses to run (exit 6).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def require_lab() -> None:
    """Exit 6 unless this job runs on a guardctl lab cluster: the hook must never act elsewhere."""
    try:
        from guardctl.testhooks import NotALab
        from guardctl.testhooks import require_lab as check
    except ImportError:
        sys.stderr.write(
            "sweep: error: GUARDCTL_SWEEP_INJECT is a test hook honoured only on a "
            "guardctl lab cluster, and guardctl is not importable here to tell; "
            "nothing was done\n"
        )
        sys.exit(6)
    try:
        check("GUARDCTL_SWEEP_INJECT")
    except NotALab as exc:
        sys.stderr.write(f"sweep: error: {exc}\n")
        sys.exit(6)


def injected_factor(node: str, spec: str | None = None) -> float:
    """The slowdown factor injected for *node* (1.0: none), from GUARDCTL_SWEEP_INJECT."""
    text = os.environ.get("GUARDCTL_SWEEP_INJECT", "") if spec is None else spec
    if text.strip():
        require_lab()
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip() == node and value:
            factor = float(value)
            if not 0.0 < factor <= 1.0:
                raise ValueError(f"GUARDCTL_SWEEP_INJECT: factor for {node} must be in (0, 1]")
            return factor
    return 1.0


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class Device:
    """One thing to burn: a GPU, or the CPU as device 0 on a CPU-only node."""

    index: int
    name: str
    multiply: Callable[[], None]  # one n x n x n multiply, finished when it returns
    flops_per_multiply: float
    samples: list[tuple[float, float]] = field(default_factory=list)  # (t, TFLOP/s)


def torch_devices(size: int) -> list[Device]:
    import torch  # optional; only on GPU nodes

    devices = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)

        def multiply(a: Any = a, b: Any = b, dev: Any = dev) -> None:
            for _ in range(8):  # amortise the synchronise
                torch.matmul(a, b)
            torch.cuda.synchronize(dev)

        devices.append(Device(i, torch.cuda.get_device_name(i), multiply, 8 * 2.0 * size**3))
    return devices


def cupy_devices(size: int) -> list[Device]:
    import cupy  # optional; only on GPU nodes

    devices = []
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        with cupy.cuda.Device(i):
            a = cupy.random.random((size, size), dtype=cupy.float32).astype(cupy.float16)
            b = cupy.random.random((size, size), dtype=cupy.float32).astype(cupy.float16)
        name = cupy.cuda.runtime.getDeviceProperties(i)["name"].decode()

        def multiply(a: Any = a, b: Any = b, i: int = i) -> None:
            with cupy.cuda.Device(i):
                for _ in range(8):
                    cupy.matmul(a, b)
                cupy.cuda.Device(i).synchronize()

        devices.append(Device(i, name, multiply, 8 * 2.0 * size**3))
    return devices


def numpy_devices(size: int) -> list[Device]:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    out = np.empty_like(a)

    def multiply() -> None:
        np.matmul(a, b, out=out)

    name = f"cpu:{cpu_model()} x{cpu_count()}"
    return [Device(0, name, multiply, 2.0 * size**3)]


NO_BACKEND = 3  # exit code: the node has GPUs and no library here can use them


def node_gpus() -> int:
    """The GPUs this node has, as far as the job can tell (0: none seen)."""
    for name in ("GUARDCTL_NODE_GPUS", "SLURM_GPUS_ON_NODE"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        listed = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        listed = 0
    return listed or len(glob.glob("/dev/nvidia[0-9]*"))


class NoGpuBackend(Exception):
    """The node has GPUs, and neither torch nor cupy can use them."""


def pick_devices(backend: str, size: int | None, gpus: int = 0) -> tuple[str, list[Device]]:
    """The first backend that works, in the order torch, cupy, numpy (or the one asked for).

    On a node with *gpus*, numpy is not tried: a CPU figure would pass a GPU node."""
    order = ["torch", "cupy", "numpy"] if backend == "auto" else [backend]
    if backend == "auto" and gpus:
        order.remove("numpy")
    failures: list[str] = []
    for name in order:
        try:
            if name == "torch":
                devices = torch_devices(size or 8192)
            elif name == "cupy":
                devices = cupy_devices(size or 8192)
            else:
                devices = numpy_devices(size or 1024)
        except Exception as exc:  # a missing library or driver: try the next backend
            if backend != "auto":
                raise SystemExit(f"gemm_burn: backend {name} unusable: {exc}") from None
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if devices:
            return name, devices
        failures.append(f"{name}: no device")
    if gpus:
        raise NoGpuBackend(
            f"no GPU backend: the node has {gpus} GPU(s) and {sys.executable} "
            f"cannot use them ({'; '.join(failures)})"
        )
    raise SystemExit("gemm_burn: no usable backend")


def burn(
    device: Device,
    duration: float,
    interval: float,
    factor: float,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    """Multiply for *duration* seconds, recording TFLOP/s once per *interval*."""
    start = time.monotonic()
    window_start, done = start, 0
    while True:
        t0 = time.monotonic()
        device.multiply()
        if factor < 1.0:
            # A slow device, simulated by really taking longer: the rate below is measured.
            time.sleep((time.monotonic() - t0) * (1.0 / factor - 1.0))
        done += 1
        now = time.monotonic()
        if now - window_start >= interval or now - start >= duration:
            tflops = done * device.flops_per_multiply / (now - window_start) / 1e12
            device.samples.append((now - start, tflops))
            emit(
                {
                    "kind": "gemm_sample",
                    "gpu": device.index,
                    "t": round(now - start, 3),
                    "tflops": round(tflops, 6),
                }
            )
            window_start, done = now, 0
        if now - start >= duration:
            return


def summary(device: Device) -> dict[str, Any]:
    values = [v for _, v in device.samples]
    # The second half is the hot, sustained part: what a long training job gets.
    sustained = values[len(values) // 2 :] or values
    return {
        "kind": "gemm_result",
        "gpu": device.index,
        "device": device.name,
        "tflops": round(statistics.median(sustained), 6),
        "tflops_first": round(values[0], 6),
        "tflops_min": round(min(values), 6),
        "samples": len(values),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds per device")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="seconds per sample (default: duration/20, at least 0.5)",
    )
    parser.add_argument("--size", type=int, default=None, help="matrix size n (n x n)")
    parser.add_argument("--backend", choices=["auto", "torch", "cupy", "numpy"], default="auto")
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error("--duration must be positive")
    interval = args.interval or max(0.5, args.duration / 20)
    node = node_name()
    factor = injected_factor(node)
    lock = threading.Lock()

    def emit(record: dict[str, Any]) -> None:
        with lock:
            print(json.dumps({"node": node, **record}), flush=True)

    try:
        backend, devices = pick_devices(args.backend, args.size, node_gpus())
    except NoGpuBackend as exc:
        emit({"kind": "sweep_undetermined", "why": str(exc)})
        sys.stderr.write(f"gemm_burn: {exc}\n")
        return NO_BACKEND

    shape = f"{len(devices)}x" if backend != "numpy" else "cpu"
    emit(
        {
            "kind": "gemm_start",
            "backend": backend,
            "devices": len(devices),
            "shape": shape,
            "duration": args.duration,
            "injected_factor": factor,
        }
    )
    threads = [
        threading.Thread(target=burn, args=(d, args.duration, interval, factor, emit))
        for d in devices
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for d in devices:
        emit({**summary(d), "backend": backend, "shape": shape})
    return 0


if __name__ == "__main__":
    sys.exit(main())
