"""The Accelerate recipe, instrument(accelerator.prepare(model)), in a real 2-rank CPU job."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate", reason="accelerate is not installed (tools/setup.sh pins it)")

HERE = Path(__file__).resolve().parent


def test_the_prepared_ddp_model_marks_from_its_hook(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", str(HERE / "accelerate_marks.py"), str(tmp_path)]  # fmt: skip
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = {}
    for rank in (0, 1):
        (path,) = (tmp_path / "steps").rglob(f"*.r{rank}.*.jsonl")
        steps[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    # Accelerate's prepared loader gives each rank half of the 50 batches.
    assert [len(s) for s in steps.values()] == [25, 25]
    assert {r["samples"] for s in steps.values() for r in s} == {32}
    fast, slow = (statistics.median(r["compute_s"] for r in steps[k][5:]) for k in (0, 1))
    # The mark came from DDP's hook: the fast rank's busy time is its own, not its wait.
    assert fast < 0.6 * slow, (fast, slow)
    assert slow > 0.09  # the slow rank's 90 ms is all its own work
