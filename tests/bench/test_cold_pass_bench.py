"""The cold-pass benchmark on a small store written for an hour: both passes, in both states
of the store (files, then segments closed as the leader closes them), agree, and a
disagreement stops it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from benchtools import bench_module

from guardctl.simulate import simulate
from guardctl.storage import layout

START = 1_764_547_200.0  # 2025-12-01T00:00Z


def _module() -> Any:
    return bench_module("cold_pass")


def test_both_passes_agree_on_files_and_on_closed_segments(tmp_path: Path) -> None:
    bench = _module()
    store = tmp_path / "store"
    simulate(
        store, nodes=16, duration=3600.0, seed=2, start=START, segment_minutes=10, handoff=True
    )
    result = bench.bench(store, 128, 60, rounds=1, gib=0.01)
    assert set(result["states"]) == {"files", "closed"}
    assert any(layout.manifests_dir(store).glob("*.json"))  # the second state was closed
    for passes in result["states"].values():
        records = {got["records"] for got in passes.values()}
        assert len(records) == 1 and records.pop() > 0
        assert all(got["touched_gib_s"][0] > 0 for got in passes.values())
    assert "| closed | needed records |" in bench.table(result)
    assert "(memory touched before at " in bench.table(result)


def test_passes_that_disagree_stop_the_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _module()
    store = tmp_path / "store"
    simulate(
        store, nodes=8, duration=1800.0, seed=2, start=START, segment_minutes=10, faults="none"
    )
    calls = iter(range(100))
    monkeypatch.setattr(
        bench,
        "run_step",
        lambda *_: {
            "seconds": 1.0,
            "peak_mib": 1,
            "records": 1,
            "kept": 1,
            "digest": str(next(calls)),
        },
    )
    with pytest.raises(SystemExit, match="disagree"):
        bench.bench(store, 64, 30, rounds=1)
