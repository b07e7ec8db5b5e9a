"""The store-listing benchmark runs from a checkout: each shape holds what its retention
leaves, a segment boundary lists every node directory (twice, the second time after
SETTLE_S), a steady call lists none, and a kept store keeps its shape (its speed is not
judged here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "store_listing.py"
NODES = 3
PER_DAY = 144  # 10-minute segments


def test_each_shape_is_listed_again_at_a_boundary_and_not_when_steady(tmp_path: Path) -> None:
    store = tmp_path / "stores"
    args = ["--nodes", str(NODES), "--days", "2", "--rounds", "1", "--store", str(store)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shapes = json.loads(done.stdout)["shapes"]
    # Two days with mirrors; one day with mirrors; one day with the newest segment's mirror,
    # in a directory per node and in a directory per segment.
    entries = {"2d": 2 * PER_DAY * 2, "1d": PER_DAY * 2, "1d-nocols": PER_DAY + 1}
    entries["1d-by-segment"] = PER_DAY + 1
    assert {name: shape["entries_per_node"] for name, shape in shapes.items()} == entries
    raw = {"2d": 2 * PER_DAY, "1d": PER_DAY, "1d-nocols": PER_DAY, "1d-by-segment": PER_DAY}
    for name, shape in shapes.items():
        steps, raw_segments = shape["steps"], raw[name]
        assert steps["cold walk"]["segments"] == raw_segments
        assert steps["cold walk"]["entries_listed"] >= NODES * entries[name]
        # A cold pass reads the last half hour's segments and the skew's margin: a few.
        assert 3 <= steps["cold pass"]["segments"] <= 8
        by_segment = name.endswith("by-segment")
        for step in ("boundary", "after settling"):  # (the bench checks the new segment's files)
            assert 1 <= steps[step]["segments"] <= raw_segments + 1  # (old ones may be left out)
            if by_segment:  # telemetry/ (a new directory in it), and the new segment's
                assert steps[step]["dirs_listed"] == 2
                assert steps[step]["entries_listed"] == PER_DAY + 1 + NODES * 2
            else:  # every node's directory
                assert steps[step]["dirs_listed"] == NODES
                assert steps[step]["entries_listed"] == NODES * (entries[name] + 2)
        assert steps["steady"]["dirs_listed"] == 0 and steps["steady"]["entries_listed"] == 0
        assert shape["memory_per_node"] > 0
        telemetry = store / name / "telemetry"
        if by_segment:  # only the segments' directories of the last half hour and more listed
            assert steps["cold pass"]["dirs_listed"] <= steps["cold pass"]["segments"] + 3
            assert len(list(telemetry.glob("*/*.jsonl"))) == PER_DAY * NODES
        else:
            assert steps["cold pass"]["dirs_listed"] >= NODES
            nodes = sorted(telemetry.iterdir())
            assert [len(os.listdir(node)) for node in nodes] == [entries[name]] * NODES
