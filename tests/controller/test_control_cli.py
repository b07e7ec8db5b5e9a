"""guardctl control, history and analyze as processes, where no Slurm is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from controltools import fleet_trace

from guardctl.actionlog import ActionLog
from guardctl.storage import store as shared_store


def guardctl(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GUARDCTL_CONFIG",)}
    env["GUARDCTL_STORE"] = str(store)
    shared_store.init(store)  # what the administrator does once, at install time
    return subprocess.run(
        [sys.executable, "-m", "guardctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_history_control_shows_only_decisions_with_their_evidence(tmp_path: Path) -> None:
    log = ActionLog(tmp_path)
    log.record("sweep jobs", "note", ["node1"], evidence={"sweep": "s1"})
    log.record(
        "control decision",
        "note",
        ["node2"],
        reason="persistent node fault: x",
        evidence={
            "decision": "quarantine",
            "rung": "b",
            "outcome": "done",
            "impact": {"pct": 14.0, "gpu_h_per_day": 860.0},
        },
    )
    log.record("quarantine", "done", ["node2"], evidence={"by": "control"})
    proc = guardctl(tmp_path, "history", "--control")
    assert proc.returncode == 0, proc.stderr
    assert "sweep jobs" not in proc.stdout
    assert "decision=quarantine rung=b outcome=done impact=14.0% 860.0 GPU-h/day" in proc.stdout
    assert "quarantine" in proc.stdout.splitlines()[-1]
    entries = json.loads(guardctl(tmp_path, "history", "--control", "--json").stdout)["entries"]
    assert [e["action"] for e in entries] == ["control decision", "quarantine"]


def test_history_control_shows_what_a_sweep_did_and_its_release(tmp_path: Path) -> None:
    log = ActionLog(tmp_path)
    log.record("control sweeping", "note", ["node3"], evidence={"by": "control", "sweep": "s7"})
    log.record("release", "intent", ["node3"], evidence={"sweep": "s7"})
    log.record("release", "done", ["node3"], evidence={"sweep": "s7"})
    log.record("release", "done", ["node4"], evidence={"sweep": "s8"})  # an operator's sweep
    log.record(
        "control sweep",
        "note",
        ["node3"],
        reason="gemm ok",
        evidence={"verdict": "pass", "action": "released", "sweep": "s7"},
    )
    proc = guardctl(tmp_path, "history", "--control")
    assert proc.returncode == 0, proc.stderr
    assert "verdict=pass action=released sweep=s7" in proc.stdout
    entries = json.loads(guardctl(tmp_path, "history", "--control", "--json").stdout)["entries"]
    assert [(e["action"], e["phase"], e["nodes"]) for e in entries] == [
        ("control sweeping", "note", ["node3"]),
        ("release", "intent", ["node3"]),
        ("release", "done", ["node3"]),
        ("control sweep", "note", ["node3"]),
    ]


def test_analyze_shows_what_a_suspect_costs_its_job(tmp_path: Path) -> None:
    fleet_trace(tmp_path, ["node1", "node2", "node3", "node4"], slow={"node2": 1.3})
    proc = guardctl(tmp_path, "analyze")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(guardctl(tmp_path, "analyze", "--json").stdout)
    node2 = next(n for n in data["nodes"] if n["node"] == "node2")
    impact = node2["impact"]
    # Its GPU 3 computes 30% longer (7 s -> 9.1 s of a 12 s step): ~2.1 s of the step.
    assert 14 < impact["pct"] < 20 and impact["gpus"] == 32
    assert impact["gpu_h_per_day"] == round(impact["pct"] / 100 * 32 * 24, 1)
    line = f"impact: node2 costs job j1 {impact['pct']:g}%, {impact['gpu_h_per_day']:.0f} GPU-h"
    assert line in proc.stdout
    assert all(n["impact"] is None for n in data["nodes"] if n["node"] != "node2")


def test_control_interval_with_once_is_a_usage_error(tmp_path: Path) -> None:
    proc = guardctl(tmp_path, "control", "--once", "--interval", "5")
    assert proc.returncode == 2 and proc.stderr.startswith("guardctl: error: --interval")


def test_status_shows_no_cost_for_a_job_that_ended_or_left_the_node(tmp_path: Path) -> None:
    from guardctl.cli.status import last_impacts
    from guardctl.slurm.types import JobInfo

    log = ActionLog(tmp_path)
    impact = {"job": "7", "pct": 55.6, "gpus": 16, "gpu_h_per_day": 213.5}
    log.record(
        "control pass",
        "note",
        ["node3"],
        evidence={"findings": [{"node": "node3", "job": "7", "impact": impact}]},
    )
    entries = log.entries()
    running = JobInfo(7, "train", "alice", "RUNNING", ("node3", "node4"))
    assert last_impacts(entries, [running]) == {"node3": impact}
    ended = JobInfo(7, "train", "alice", "COMPLETED", ("node3", "node4"))
    assert last_impacts(entries, [ended]) == {}
    assert last_impacts(entries, []) == {}  # gone from Slurm's queue
    elsewhere = JobInfo(7, "train", "alice", "RUNNING", ("node5", "node6"))  # requeued off it
    assert last_impacts(entries, [elsewhere]) == {}
