"""guardctl.torch.fsdp in a real FSDP2 job: 3 gloo ranks under torchrun, one slow."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from torchjobs import rank_steps, torchrun

torch = pytest.importorskip("torch")

from guardctl.torch import fsdp  # noqa: E402


def compute_medians(store: Path, steps: int) -> dict[int, float]:
    """Each rank's median compute_s over its records, the first 5 steps (warm-up) left out."""
    medians = {}
    for rank, records in rank_steps(store, 3).items():
        assert len(records) == steps and {r["samples"] for r in records} == {32}
        medians[rank] = statistics.median(r["compute_s"] for r in records[5:])
    return medians


def test_timed_collectives_show_the_straggler_that_a_single_mark_hides(tmp_path: Path) -> None:
    torchrun("fsdp_marks.py", 3, tmp_path)
    timed, after = (compute_medians(tmp_path / name, 25) for name in ("timed", "after"))
    # Timed collectives: the fast ranks' waits for rank 2 are communication, not compute.
    assert max(timed[0], timed[1]) * 1.5 < timed[2], timed
    assert timed[2] > 0.08  # rank 2's 80 ms sleep is all its own work
    # One mark after backward(): every rank's "compute" includes the wait; rank 2 is hidden.
    assert min(after[0], after[1]) > 0.8 * after[2], after
    # An explicit unshard(async_op=True) that rank 2 starts 100 ms late: the fast ranks'
    # wait in its handle is communication too (counted as compute, theirs would be ~0.7x).
    prefetched = compute_medians(tmp_path / "async", 15)
    assert max(prefetched[0], prefetched[1]) < 0.4 * prefetched[2], prefetched


def test_instrument_wants_fully_shard_units() -> None:
    with pytest.raises(TypeError, match="fully_shard"):
        fsdp.instrument(torch.nn.Linear(2, 2))


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")  # one rank: no shards
def test_instrument_refuses_fsdp1_whose_gathers_it_cannot_time(tmp_path: Path) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = FullyShardedDataParallel(torch.nn.Linear(2, 2), device_id=torch.device("cpu"))
        with pytest.raises(TypeError, match="FSDP1"):
            fsdp.instrument(model)
    finally:
        dist.destroy_process_group()
