"""The Accelerate recipe, instrument(accelerator.prepare(model)), in a real 2-rank CPU job."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from torchjobs import rank_steps, torchrun

pytest.importorskip("torch")
pytest.importorskip("accelerate", reason="accelerate is not installed (tools/setup.sh pins it)")


def test_the_prepared_ddp_model_marks_from_its_hook(tmp_path: Path) -> None:
    torchrun("accelerate_marks.py", 2, tmp_path)
    steps = rank_steps(tmp_path, 2)
    # Accelerate's prepared loader gives each rank half of the 50 batches.
    assert [len(s) for s in steps.values()] == [25, 25]
    assert {r["samples"] for s in steps.values() for r in s} == {32}
    fast, slow = (statistics.median(r["compute_s"] for r in steps[k][5:]) for k in (0, 1))
    # The mark came from DDP's hook: the fast rank's busy time is its own, not its wait.
    assert fast < 0.6 * slow, (fast, slow)
    assert slow > 0.09  # the slow rank's 90 ms is all its own work
