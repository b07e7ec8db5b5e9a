"""The open-segment benchmark runs from a checkout, and every form reads back what was appended.

Its speeds are not judged here; what is checked is that every writer and reader is measured,
that each form holds the records the agents appended (per kind, the bench fails otherwise), and
that its parts do what the report says: an Arrow stream file is one schema and a batch per
append, and the JSON Lines forms hold the very lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchtools import REPO, bench_module

SCRIPT = REPO / "bench" / "open_segment.py"


def test_every_form_is_measured_and_holds_the_records_appended() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--gpus", "64", "--minutes", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    bench = bench_module("open_segment")
    assert list(result["write"]) == list(bench.WRITERS)
    assert list(result["read"]) == list(bench.READERS)
    kinds = result["read"]["jsonl"]["kinds"]
    assert sum(kinds.values()) == result["records"] and kinds["step"] > 0
    for row in result["write"].values():
        assert row["appends"] > 0 and row["bytes_per_record"] > 0 and row["agent_rss_mib"] > 0


def test_a_stream_file_is_a_batch_per_append_and_lines_stay_lines(tmp_path: Path) -> None:
    import pyarrow.ipc as ipc

    bench = bench_module("open_segment")
    lines = [
        b'{"v":1,"kind":"host","ts":10.0,"node":"n1","cpu_pct":5.0,"load1":1.0,"mem_used_pct":3.0}\n',
        b'{"v":1,"kind":"step","ts":11.0,"node":"n1","job":"7","rank":0,"step":1,"step_s":2.5}\n',
    ]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"telemetry/n1/x.jsonl": [[ln.decode()] for ln in lines]}))
    stream = bench.write("ipc", plan, tmp_path / "ipc")
    assert stream["appends"] == 2
    reader = ipc.open_stream(str(tmp_path / "ipc" / "telemetry/n1/x.jsonl"))
    batches = list(reader)
    assert [b.num_rows for b in batches] == [1, 1]
    assert reader.schema == bench._wide_schema()
    assert batches[1].column("step_s").to_pylist() == [2.5]
    bench.write("jsonl", plan, tmp_path / "jsonl")
    assert (tmp_path / "jsonl" / "telemetry/n1/x.jsonl").read_bytes() == b"".join(lines)
