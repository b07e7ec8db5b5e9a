"""guardctl control, history and analyze as processes, where no Slurm is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from controltools import fleet_trace

from guardctl.actionlog import ActionLog


def guardctl(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GUARDCTL_CONFIG",)}
    env["GUARDCTL_STORE"] = str(store)
    return subprocess.run([sys.executable, "-m", "guardctl", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_history_control_shows_only_decisions_with_their_evidence(tmp_path: Path) -> None:
    log = ActionLog(tmp_path)
    log.record("sweep jobs", "note", ["node1"], evidence={"sweep": "s1"})
    log.record("control decision", "note", ["node2"], reason="persistent node fault: x",
               evidence={"decision": "quarantine", "rung": "b", "outcome": "done",
                         "impact": {"pct": 14.0, "gpu_h_per_day": 860.0}})
    log.record("quarantine", "done", ["node2"], evidence={"by": "control"})
    proc = guardctl(tmp_path, "history", "--control")
    assert proc.returncode == 0, proc.stderr
    assert "sweep jobs" not in proc.stdout
    assert "decision=quarantine rung=b outcome=done impact=14.0% 860.0 GPU-h/day" in proc.stdout
    assert "quarantine" in proc.stdout.splitlines()[-1]
    entries = json.loads(guardctl(tmp_path, "history", "--control", "--json").stdout)["entries"]
    assert [e["action"] for e in entries] == ["control decision", "quarantine"]


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
