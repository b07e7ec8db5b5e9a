"""Where comm_begin() is marked decides whether a DDP straggler shows (a real gloo job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from guardctl.torch import instrument  # noqa: E402

HERE = Path(__file__).resolve().parent


def test_the_hook_shows_the_straggler_that_a_mark_after_backward_hides(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", str(HERE / "ddp_marks.py"), str(tmp_path)]  # fmt: skip
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    fast, slow = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # After backward(): the fast rank's "compute" includes waiting for the slow one.
    assert fast["after"] > 0.8 * slow["after"], (fast, slow)
    # From the hook: the fast rank's busy time is its own, about a third of the slow one's.
    assert fast["hook"] < 0.6 * slow["hook"], (fast, slow)
    assert slow["hook"] > 0.09  # the slow rank's 90 ms forward is all compute


def test_instrument_wants_a_ddp_model() -> None:
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        instrument(torch.nn.Linear(2, 2))
