"""The data-sharding benchmarks run from a checkout, against the real service.

They measure speed, which a test here does not judge; what is checked is that
each runs to the end and reports what the docs quote, and the one outcome
that does not depend on the machine's speed: the per-step split gives the
4x-slower rank the smallest share.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _bench(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_epoch_benchmark_runs_all_three_ways_of_sharing() -> None:
    result = _bench("dds_epoch.py", "--quick")
    assert result["static_s"] > 0 and result["pull_s"] > 0 and result["per_step_s"] > 0
    shares = result["per_step_last_shares"]
    last_step = result["records"] % result["global_batch"] or result["global_batch"]
    assert len(shares) == result["workers"] and sum(shares) == last_step
    slow = shares[-1]  # the last rank is the slow one
    assert slow < min(shares[:-1])
    assert result["pull_speedup"] == round(result["static_s"] / result["pull_s"], 2)


def test_the_throughput_benchmark_reports_every_point() -> None:
    result = _bench(
        "dds_throughput.py", "--seconds", "0.5", "--clients", "64", "--paced-ops", "2000"
    )
    modes = [p["mode"] for p in result["points"]]
    assert modes == [
        "health",
        "lease+ack",
        "ack+lease combined",
        "lease+ack paced at 2000 ops/s",
        "ack+lease combined paced at 2000 ops/s",
    ]
    for point in result["points"]:
        assert point["clients"] == 64 and point["ops"] > 0
        assert 0 < point["p50_ms"] <= point["p99_ms"]
    assert result["statements_per_commit"] > 0
    assert result["sequential_client"]["stdlib_http_client_ms"] > 0


def test_the_http_cost_benchmark_measures_both_servers() -> None:
    result = _bench("dds_http_cost.py", "--requests", "640", "--clients", "8", "--rounds", "1")
    [[bare, ours]] = result["rounds"]
    assert (bare["kind"], ours["kind"]) == ("bare", "guardctl")
    for point in (bare, ours):
        assert point["requests"] == 640 and point["loop_cpu_us_per_request"] > 0
    assert ours["ratio_to_bare"] == round(
        ours["loop_cpu_us_per_request"] / bare["loop_cpu_us_per_request"], 2
    )
