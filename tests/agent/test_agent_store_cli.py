"""``guardctl store check`` and ``guardctl store prune`` as an operator runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guardctl.errors import UsageError
from guardctl.storage import layout, store
from guardctl.telemetry.schema import dumps, make_record

NOW = 1_796_043_600.0  # 2026-11-30T13:00:00Z


def guardctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARDCTL_")}
    return subprocess.run(
        [sys.executable, "-m", "guardctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(path: Path, lines: list[str], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines) + tail)
    return path


def good_lines(node: str, ts: float) -> list[str]:
    return [
        dumps(make_record("host", node, ts, cpu_pct=10.0, load1=1.0, mem_used_pct=20.0)),
        dumps(make_record("gpu", node, ts, gpu=0, sm_clock_mhz=1980, xid=None)),
        dumps(make_record("nic", node, ts, device="mlx5_0", port=1, rate_gbps=400.0)),
    ]


def test_check_all_good_exits_0(tmp_path: Path) -> None:
    write(layout.node_telemetry_file(tmp_path, "n1", NOW), good_lines("n1", NOW))
    proc = guardctl("store", "check", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["good"] == {"gpu": 1, "host": 1, "nic": 1}
    assert report["bad_total"] == 0 and report["files"] == 1 and report["lines"] == 3


def test_check_counts_bad_lines_per_reason_exits_1(tmp_path: Path) -> None:
    bad = [
        '{"v":1,"kind":"host","ts":1,"node":"n1","cpu_pct":NaN}',
        '{"v":1,"kind":"fan","ts":1,"node":"n1"}',
        '{"v":2,"kind":"host","ts":1,"node":"n1"}',
        '{"v":1,"kind":"gpu","ts":1,"node":"n1","gpu":"zero"}',
        "not json at all",
    ]
    path = write(tmp_path / "mixed.jsonl", good_lines("n1", NOW) + bad, tail='{"v":1,"ki')
    proc = guardctl("store", "check", str(path), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["good_total"] == 3
    assert report["bad"] == {
        "not_finite": 1,
        "unknown_kind": 1,
        "unknown_version": 1,
        "wrong_type": 1,
        "not_json": 1,
        "truncated": 1,
    }
    assert report["bad_files"] == {str(path): report["bad"]}
    table = guardctl("store", "check", str(path))
    assert table.returncode == 1 and "9 lines, 3 good, 6 bad" in table.stdout


def test_check_unreadable_path_exits_7(tmp_path: Path) -> None:
    proc = guardctl("store", "check", str(tmp_path / "missing"))
    assert proc.returncode == 7
    assert proc.stderr.startswith("guardctl: error:") and "missing" in proc.stderr


def test_parse_duration() -> None:
    assert store.parse_duration("7d") == 7 * 86400
    assert store.parse_duration("12h") == 43200
    assert store.parse_duration("90m") == 5400
    assert store.parse_duration("1.5h") == 5400
    for bad in ("", "7", "d", "-1d", "0h", "7 days", "1y"):
        with pytest.raises(UsageError):
            store.parse_duration(bad)


def fill_store(root: Path) -> dict[str, Path]:
    files = {
        "old_node": layout.node_telemetry_file(root, "n1", NOW - 8 * 86400),
        "edge": layout.node_telemetry_file(root, "n1", NOW - 7 * 86400 - 3600),  # ended 7d ago
        "recent": layout.node_telemetry_file(root, "n1", NOW - 3600),
        "old_step": layout.step_file(root, "4242", "n2", 0, NOW - 30 * 86400),
        "new_step": layout.step_file(root, "5000", "n2", 0, NOW),
        "not_ours": root / "telemetry" / "n1" / "notes.jsonl",
        "actions": layout.actions_log(root),
    }
    for path in files.values():
        write(path, ["{}"])
    return files


def test_prune_deletes_only_expired_hourly_files(tmp_path: Path) -> None:
    files = fill_store(tmp_path)
    dry = store.prune(tmp_path, 7 * 86400, now=NOW, dry_run=True)
    assert sorted(dry.files) == sorted(str(files[k]) for k in ("old_node", "edge", "old_step"))
    assert all(p.exists() for p in files.values())  # dry run changed nothing
    done = store.prune(tmp_path, 7 * 86400, now=NOW)
    assert done.files == dry.files and done.bytes == 3 * 3
    gone = {k for k, p in files.items() if not p.exists()}
    assert gone == {"old_node", "edge", "old_step"}
    assert not (tmp_path / "steps" / "4242").exists()  # the job's empty directory went too
    assert (tmp_path / "steps").is_dir() and files["recent"].parent.is_dir()
    assert not files["old_node"].parent.exists()  # a segment's directory went with its files


def test_prune_cli_dry_run_and_json(tmp_path: Path) -> None:
    files = fill_store(tmp_path)
    old = files["old_step"]
    os.utime(old, (time.time(), time.time()))  # mtime does not matter: the hour in the name does
    proc = guardctl(
        "store", "prune", "--store", str(tmp_path), "--older-than", "7d", "--dry-run", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["dry_run"] and str(old) in report["files"] and old.exists()
    proc = guardctl("store", "prune", "--store", str(tmp_path), "--older-than", "7d")
    assert proc.returncode == 0 and not old.exists() and "deleted" in proc.stdout
    bad = guardctl("store", "prune", "--store", str(tmp_path), "--older-than", "soon")
    assert bad.returncode == 2 and "invalid duration" in bad.stderr
