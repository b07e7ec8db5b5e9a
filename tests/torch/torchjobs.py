"""Real multi-process torch jobs for the tests: a job script under torchrun, its ranks' steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def torchrun(script: str, ranks: int, out: Path) -> None:
    """Run *script* (of this folder) as *ranks* gloo ranks on this host, *out* its argument."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    env["OMP_NUM_THREADS"] = "1"  # ranks share two cores: one thread each
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        str(HERE / script),
        str(out),
    ]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def rank_steps(store: Path, ranks: int) -> dict[int, list[dict[str, Any]]]:
    """Each rank's step records in *store*, in the order written."""
    steps = {}
    for rank in range(ranks):
        (path,) = (store / "steps").rglob(f"*.r{rank}.*.jsonl")
        steps[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return steps
