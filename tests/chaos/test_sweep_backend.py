"""A GPU node is never swept with the CPU burn-in: without torch or cupy the GEMM program says
"no GPU backend", the sweep is undetermined (kept quarantined, never a pass), and
``guardctl sweep --dry-run`` says which program and backend each node's jobs would run.

The sweep program runs for real (``sweeps/gemm_burn.py``); the fake is at the hardware
boundary only: a Python path where torch and cupy cannot be imported (a venv without them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from controltools import fleet_trace
from sweepchaos import NODES, daemon, decision, drained, log, quarantined, settings, verdicts

from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest
from guardctl.sweep.engine import SweepOptions, run_sweep

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"


def without_gpu_libraries(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import torch or cupy."""
    fake = tmp_path / "no-gpu-libraries"
    fake.mkdir(exist_ok=True)
    for name in ("torch", "cupy"):
        (fake / f"{name}.py").write_text(f"raise ImportError('no {name} in this venv')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    return {**env, "PYTHONPATH": str(fake)}


def burn(env: dict[str, str], out: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(SWEEPS / "gemm_burn.py"), "--duration", "0.3", "--size", "64"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out is not None:
        out.write_text(proc.stdout)
    return proc


def records(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_the_gemm_program_on_a_gpu_node_without_torch_or_cupy_says_no_gpu_backend(
    tmp_path: Path,
) -> None:
    env = without_gpu_libraries(tmp_path)
    gpu = burn({**env, "GUARDCTL_NODE_GPUS": "8"})
    assert gpu.returncode == 3, gpu.stderr
    (said,) = records(gpu.stdout)
    assert said["kind"] == "sweep_undetermined"
    assert "no GPU backend: the node has 8 GPU(s)" in str(said["why"])
    assert "no torch in this venv" in str(said["why"])
    assert not [r for r in records(gpu.stdout) if r["kind"] == "gemm_result"]  # no CPU figure
    cpu = burn(env)  # a CPU-only node: the numpy burn-in, as before
    assert cpu.returncode == 0, cpu.stderr
    assert [r["backend"] for r in records(cpu.stdout) if r["kind"] == "gemm_result"] == ["numpy"]


class Recording(MemorySlurm):
    """The in-memory Slurm, keeping every sbatch request (what the job would be run with)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.requests: dict[int, SubmitRequest] = {}

    def submit(self, request: SubmitRequest) -> int:
        job = super().submit(request)
        self.requests[job] = request
        return job


def test_a_gpu_node_whose_sweep_finds_no_gpu_backend_is_undetermined_not_passed(
    tmp_path: Path,
) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = Recording(NODES, start=time.time(), gres="gpu:h100:8(S:0-1)")
    c = daemon(tmp_path, slurm)
    assert decision(c, "node2")["outcome"] == "sweep started"
    env = without_gpu_libraries(tmp_path)
    for _ in range(2):  # gemm, then nccl: each run as the job would run it, on node2
        (job,) = [
            j for j in slurm.jobs() if j.state == "RUNNING" and j.reservation == "guardctl_q_node2"
        ]
        request = slurm.requests[job.job_id]
        assert request.env["GUARDCTL_NODE_GPUS"] == "8"  # from Slurm's Gres
        assert "--no-requeue" in request.extra
        if "gemm" in request.script:
            proc = burn({**env, **request.env, "SLURMD_NODENAME": "node2"}, Path(request.output))
            slurm.finish(job.job_id, proc.returncode)
        else:
            slurm.finish(job.job_id, 3)
    waits = decision(c, "node2")
    assert verdicts(c, "node2") == ["undetermined"]
    (judged,) = log(c, "control sweep", "node2")
    assert judged.reason.startswith("undetermined: sweep gemm node2: no GPU backend"), judged
    assert waits["decision"] == "wait" and "no GPU backend" in waits["why"]
    assert quarantined(slurm, "node2") and not drained(slurm, "node2")
    assert not log(c, "release") and not log(c, "drain")


def test_a_dry_run_says_which_program_and_backend_each_node_would_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "python-without-gpu-libraries"  # no site-packages: no torch, no cupy
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    cfg = settings(tmp_path, sweep={"python": str(bare)})
    slurm = MemorySlurm(["cpu1", "cpu2", "cpu3"], start=time.time())
    slurm.add_node("gpu1", gres="gpu:h100:8(S:0-1)")
    report = run_sweep(
        cfg, ["cpu1", "gpu1"], SweepOptions(kind="single", dry_run=True), ops=NodeOps(cfg, slurm)
    )
    gemm = {p["nodes"][0]: p for p in report.planned if p["sweep"] == "gemm"}
    assert gemm["cpu1"]["program"] == "gemm.sbatch: gemm_burn.py"
    assert gemm["cpu1"]["backend"].startswith("numpy on the CPU")
    assert gemm["gpu1"]["backend"].startswith("none: no GPU backend (torch or cupy)")
    assert "would be undetermined" in gemm["gpu1"]["backend"]
    from guardctl.cli.sweep import _print  # what `guardctl sweep --dry-run` prints

    _print(report)
    table = capsys.readouterr().out
    assert "PROGRAM" in table and "BACKEND" in table and "no GPU backend" in table, table
    nccl = {p["nodes"][0]: p for p in report.planned if p["sweep"] == "nccl"}
    assert "allreduce.py" in nccl["gpu1"]["program"]
    assert slurm.reservations() == [] and slurm.jobs() == []  # a dry run changes nothing
    with_torch = settings(tmp_path)  # this Python: torch is installed here (tests run it)
    again = run_sweep(
        with_torch,
        ["gpu1"],
        SweepOptions(kind="single", dry_run=True),
        ops=NodeOps(with_torch, slurm),
    )
    assert [p["backend"] for p in again.planned if p["sweep"] == "gemm"] == ["torch on 8 GPU(s)"]


def test_gres_strings_count_gpus() -> None:
    from guardctl.sweep.backend import gres_gpus

    assert [
        gres_gpus(g)
        for g in (
            "",
            "(null)",
            "gpu:8",
            "gpu:h100:8(S:0-1)",
            "gpu:a:4(S:0,1),gpu:b:4(S:1)",
            "gpu:1080:2",
            "gpu:2g.10gb:3,mps:100",
        )
    ] == [0, 0, 8, 8, 8, 2, 3]
