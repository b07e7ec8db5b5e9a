"""The closed-segment format benchmark runs from a checkout and reads back what it wrote.

Its speeds are not judged here; what is checked is that every candidate format and
baseline is measured and named in the report, and that each read gives back the records
written: per kind as many, with the same values.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchtools import bench_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "segment_format.py"


def _module() -> Any:
    return bench_module("segment_format")


def test_every_format_is_measured_and_reads_back_what_was_written(tmp_path: Path) -> None:
    tiny = ["--nodes", "4", "--json", "--cold", "fadvise", "--dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *tiny],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [result] = json.loads(done.stdout)
    bench = _module()
    names = [*bench.candidate_names(), *bench.BASELINES]
    assert sorted(result["candidates"]) == sorted(names)
    assert result["mismatches"] == []
    written = result["records"]
    assert written["gpu"] > 0 and written["step"] > 0 and len(result["segments"]) == 2
    for name in names:
        row = result["candidates"][name]
        assert row["bytes"] > 0 and row["cold"]["seconds"] > 0 and row["warm"]["seconds"] > 0
        if name == "bytes":
            continue
        for step in ("cold", "warm"):  # every kind, record for record
            assert row[step]["records"] == written and row[step]["same"], (name, step)
        assert row["minute"]["rows"] > 0 and row["nodes"]["rows"] > 0
        assert row["minute"]["same"] and row["nodes"]["same"], name
    for name in bench.candidate_names():
        assert result["candidates"][name]["write"]["seconds"] > 0
    report = bench.table(result)
    for name in names:
        assert f"| {bench._label(name)} |" in report
    for reader in ("duckdb", "polars"):
        got = result["foreign"][reader]
        assert ("skipped" in got) if importlib.util.find_spec(reader) is None else got["same"]
        assert reader in report
