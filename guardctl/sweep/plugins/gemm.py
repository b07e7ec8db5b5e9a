"""Sweep ``gemm``: per-GPU matrix-multiply burn-in, judged on sustained TFLOP/s per GPU.

Runs ``sweeps/gemm.sbatch`` (gemm_burn.py: torch or cupy on GPUs, numpy on
CPU-only nodes) on one node for the sweep's duration; some GPUs slow down only
once hot, so the figure judged is the median of the second half of the run.
"""

from __future__ import annotations

import dataclasses
import json

from guardctl.slurm.types import SubmitRequest
from guardctl.sweep.registry import JobSpec, Measurement, Scope, register


class GemmSweep:
    """Build, parse: one measurement per GPU (``cpu0`` on a CPU-only node)."""

    name = "gemm"
    scope: Scope = "single"

    def build(self, job: JobSpec) -> SubmitRequest:
        args = ["--duration", f"{job.duration_s:g}"]
        if job.options.get("gemm_size"):
            args += ["--size", str(int(job.options["gemm_size"]))]
        threads = int(job.options.get("gemm_threads", 0))
        req = job.request("gemm.sbatch", args)
        env = dict(req.env)
        if threads:
            env["GUARDCTL_GEMM_THREADS"] = str(threads)
        return dataclasses.replace(req, env=env)

    def parse(self, text: str, nodes: tuple[str, ...]) -> list[Measurement]:
        out = []
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # stderr noise
            if not isinstance(rec, dict) or rec.get("kind") != "gemm_result":
                continue
            try:
                backend = str(rec.get("backend", ""))
                unit = f"cpu{rec['gpu']}" if backend == "numpy" else f"gpu{rec['gpu']}"
                device, shape = str(rec["device"]), str(rec.get("shape", ""))
                out.append(
                    Measurement(
                        sweep=self.name,
                        nodes=nodes[:1],
                        unit=unit,
                        metric="TFLOP/s",
                        value=float(rec["tflops"]),
                        key=f"gemm|{device}|{shape}",
                        detail={
                            "backend": backend,
                            "tflops_first": rec.get("tflops_first"),
                            "tflops_min": rec.get("tflops_min"),
                            "samples": rec.get("samples"),
                        },
                    )
                )
            except (KeyError, TypeError, ValueError):
                continue
        return out


register(GemmSweep())
