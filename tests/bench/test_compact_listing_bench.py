"""The leader's-compaction benchmark runs from a checkout: both ways find the same segments
closed, and only the old way lists the store (its speed is not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "compact_listing.py"


def test_the_leaders_call_lists_nothing_and_agrees_with_the_walk(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ["--nodes", "3", "--days", "1", "--rounds", "1", "--store", str(store), "--json"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["nodes"] == 3 and result["report"]["current"] == 144  # a day of segments
    assert result["report"]["closed"] == [] and result["report"]["open"] == 0
    walk, reused = result["ways"]["walk"], result["ways"]["from the pass"]
    assert walk["dirs_listed"] >= 3 and walk["entries_listed"] >= 3 * 144 * 2
    assert reused["dirs_listed"] == 0 and reused["entries_listed"] == 0
    # An hour of passes: as it was, every segment of the last 3 hours each pass (18, fewer as
    # the hour goes on); by age, each only as often as its age says (fewer than a quarter).
    every, by_age = result["passes"]["every pass"], result["passes"]["by age"]
    assert every["segments_looked"] >= 60 * 12 and every["files_looked"] >= 3 * 60 * 12
    assert 0 < by_age["segments_looked"] < every["segments_looked"] / 4
    # A leader taking over keeps to the last one's looks: only what is due then, not all.
    over = result["taking_over"]
    assert over["nothing to go by"] >= 12
    assert over["going by the last leader's looks"] < over["nothing to go by"] / 2
