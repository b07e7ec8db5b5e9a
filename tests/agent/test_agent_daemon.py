"""The agent in-process: real collectors over recorded trees and a fake NVML, a failing disk."""

from __future__ import annotations

import errno
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import Disk, FakeNvml, settings

from guardctl.agent.daemon import Agent
from guardctl.analyze.load import read_frame
from guardctl.storage import layout, store
from guardctl.storage.writer import LineWriter
from guardctl.telemetry.schema import read_path

TS = 1_796_040_000.0  # 2026-11-30T12:00:00Z


@pytest.fixture(autouse=True)
def _marked_store(tmp_path: Path) -> None:
    """The agents here write into tmp_path, marked as the site's store (guardctl store init)."""
    store.init(tmp_path)


def health(agent: Agent) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in agent.status()["collectors"]}


def test_one_sample_writes_every_collector(tmp_path: Path, fake_nvml: FakeNvml) -> None:
    agent = Agent(settings(status_file=str(tmp_path / "run" / "status.json")), tmp_path, "gpu01")
    assert agent.sample(TS)
    agent.close()
    path = layout.node_telemetry_file(tmp_path, "gpu01", TS)
    # TS is 12:00:00: the default segment, ten minutes from then
    assert path == tmp_path / "telemetry" / "20261130T1200_10m" / "gpu01.jsonl"
    result = read_path(path)
    kinds = [r["kind"] for r in result.records]
    assert kinds == ["gpu"] * 8 + ["host"] + ["nic"] * 2 + ["agent"] * 3
    assert result.bad_total == 0
    assert {r["ts"] for r in result.records} == {TS}
    health_records = [r for r in result.records if r["kind"] == "agent"]
    assert [(r["collector"], r["state"], r["ok"], r["error"]) for r in health_records] == [
        ("nvml", "ok", True, ""),
        ("host", "ok", True, ""),
        ("infiniband", "ok", True, ""),
    ]
    assert all(r["duration_s"] > 0 for r in health_records)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert [c["state"] for c in status["collectors"]] == ["ok", "ok", "ok"]
    assert [c["records"] for c in status["collectors"]] == [8, 1, 2]
    assert all(c["duration_s"] > 0 for c in status["collectors"])
    assert status["store"]["written"] == 14


def test_segment_rotation(tmp_path: Path, fake_nvml: FakeNvml) -> None:
    agent = Agent(settings(collectors=("host",)), tmp_path, "n1")
    agent.sample(TS + 3599.5)
    agent.sample(TS + 3600.5)
    agent.close()
    files = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "telemetry").rglob("n1.*"))
    # each segment's file (ten minutes by default) with its column mirror
    assert files == [
        "telemetry/20261130T1250_10m/n1.cols",
        "telemetry/20261130T1250_10m/n1.jsonl",
        "telemetry/20261130T1300_10m/n1.cols",
        "telemetry/20261130T1300_10m/n1.jsonl",
    ]
    frame = read_frame(tmp_path / "telemetry")
    assert frame.count("host") == 2 and frame.files == 2


def test_no_driver_does_not_stop_the_others(
    tmp_path: Path, fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="guardctl.agent")
    fake_nvml.no_driver = True
    agent = Agent(settings(retry_unavailable_s=0.2), tmp_path, "n1")
    for i in range(3):
        agent.sample(TS + i)
    state = health(agent)
    assert state["nvml"]["state"] == "unavailable" and not state["nvml"]["ok"]
    assert "no NVIDIA driver" in state["nvml"]["error"]
    assert state["host"]["ok"] and state["infiniband"]["records"] == 2
    no_driver = [r for r in caplog.records if "no NVIDIA driver" in r.getMessage()]
    assert len(no_driver) == 1  # said once, not every sample
    # The driver comes back (module loaded): picked up at the next retry.
    fake_nvml.no_driver = False
    time.sleep(0.25)
    agent.sample(TS + 10)
    agent.close()
    assert health(agent)["nvml"]["state"] == "ok"
    kinds = [r["kind"] for r in read_path(tmp_path / "telemetry").records]
    assert kinds.count("host") == 4 and kinds.count("gpu") == 8


def test_a_hung_collector_times_out_alone(tmp_path: Path, fake_nvml: FakeNvml) -> None:
    agent = Agent(settings(timeouts={"nvml": 0.2}), tmp_path, "n1")
    agent.sample(TS)  # nvml starts normally
    fake_nvml.delay_s = 0.1  # each NVML call now takes 100 ms: a sample takes seconds
    started = time.perf_counter()
    agent.sample(TS + 1)
    took = time.perf_counter() - started
    assert took < 1.0
    assert health(agent)["nvml"]["state"] == "timeout"
    assert health(agent)["host"]["state"] == "ok"
    time.sleep(0.2)
    agent.sample(TS + 2)
    assert health(agent)["nvml"]["state"] == "busy"  # still stuck: no second thread
    fake_nvml.delay_s = 0.0
    time.sleep(0.3)
    agent.sample(TS + 3)  # the stuck call finished: its late records are not used
    assert health(agent)["nvml"]["state"] == "ok"
    agent.close()
    gpu_ts = sorted({r["ts"] for r in read_path(tmp_path).records if r["kind"] == "gpu"})
    assert gpu_ts == [TS, TS + 3]
    assert len([r for r in read_path(tmp_path).records if r["kind"] == "host"]) == 4


def test_a_collector_bug_is_reported_not_fatal(
    tmp_path: Path, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> int:
        raise sys.modules["pynvml"].NVMLError_Unknown(999)

    monkeypatch.setattr(sys.modules["pynvml"], "nvmlDeviceGetCount", broken)
    agent = Agent(settings(), tmp_path, "n1")
    agent.sample(TS)
    agent.close()
    state = health(agent)["nvml"]
    assert state["state"] == "error" and "NVMLError_Unknown" in state["error"]
    assert health(agent)["host"]["ok"]


def test_store_full_then_back(
    tmp_path: Path, fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="guardctl.agent")
    disk = Disk()
    # 14 records a sample (11 and 3 of the agent's health); room for 3 samples in memory.
    agent = Agent(settings(buffer_records=42), tmp_path, "n1", writer=LineWriter(write=disk.write))
    agent.sample(TS)
    disk.error = errno.ENOSPC
    for i in range(1, 6):
        assert not agent.sample(TS + i)  # keeps sampling
    store = agent.status()["store"]
    assert not store["writable"] and store["buffered"] == 42 and store["dropped"] == 28
    assert "ENOSPC" in store["error"]
    disk.error = None
    assert agent.sample(TS + 6)
    agent.close()
    records = read_path(tmp_path).records
    # The buffer holds 3 samples, the one taken on recovery included: samples 1-3
    # were dropped (oldest first); the rest is there, in order.
    assert sorted({r["ts"] for r in records}) == [TS, TS + 4, TS + 5, TS + 6]
    assert [r["ts"] for r in records] == sorted(r["ts"] for r in records)
    assert agent.status()["store"]["dropped"] == 42
    warnings = [r.getMessage() for r in caplog.records if "store" in r.getMessage()]
    assert len(warnings) == 2 and "42 records dropped" in warnings[1]
