"""Where comm_begin() is marked decides whether a DDP straggler shows (a real gloo job)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torchjobs import torchrun

torch = pytest.importorskip("torch")

from guardctl.torch import instrument  # noqa: E402


def test_the_hook_shows_the_straggler_that_a_mark_after_backward_hides(tmp_path: Path) -> None:
    torchrun("ddp_marks.py", 2, tmp_path)
    fast, slow = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # After backward(): the fast rank's "compute" includes waiting for the slow one.
    assert fast["after"] > 0.8 * slow["after"], (fast, slow)
    # From the hook: the fast rank's busy time is its own, about a third of the slow one's.
    assert fast["hook"] < 0.6 * slow["hook"], (fast, slow)
    assert slow["hook"] > 0.09  # the slow rank's 90 ms forward is all compute


def test_instrument_wants_a_ddp_model() -> None:
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        instrument(torch.nn.Linear(2, 2))
