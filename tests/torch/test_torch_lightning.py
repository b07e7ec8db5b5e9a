"""guardctl's Lightning callback in a real Lightning DDP job (torchrun, 2 gloo ranks)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from torchjobs import rank_steps, torchrun

pytest.importorskip("torch")
pytest.importorskip("lightning")


def test_the_callback_times_each_batch_and_marks_from_ddps_hook(tmp_path: Path) -> None:
    torchrun("lightning_marks.py", 2, tmp_path)
    steps = rank_steps(tmp_path, 2)
    assert [len(s) for s in steps.values()] == [25, 25]  # one record per batch
    assert {r["samples"] for s in steps.values() for r in s} == {32}
    fast, slow = (statistics.median(r["compute_s"] for r in steps[k][5:]) for k in (0, 1))
    # The mark came from DDP's hook: the fast rank's busy time is its own, not its wait.
    assert fast < 0.6 * slow, (fast, slow)
    assert slow > 0.09  # the slow rank's 90 ms is all its own work
    # and the whole step is the same on both (synchronous DDP)
    step0, step1 = (statistics.median(r["step_s"] for r in steps[k][5:]) for k in (0, 1))
    assert abs(step0 - step1) < 0.3 * max(step0, step1), (step0, step1)
