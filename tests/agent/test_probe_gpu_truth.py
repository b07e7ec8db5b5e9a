"""tools/gpu_truth_probe.py's checks, on a simulated GPU stream (no GPU here).

The stand-in keeps what matters about a CUDA stream: work is queued and runs
later, an event takes the stream's time when the work queued before it is done,
and only ``synchronize`` waits. Host and stream share one virtual clock, which
only waiting moves, so the checks pass and fail here as they would on a GPU, and
the same way however loaded the machine running the tests is.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from agent_helpers import load_tool

from guardctl import probe
from guardctl.identity import Identity

COMPUTE_S = 0.02
GATHER_S = 0.005


class Stream:
    """A GPU stream on a virtual clock: queued work ends at ``free_at``; waiting for it
    moves the clock there."""

    def __init__(self, rate: float = 1.0) -> None:
        self.now = 0.0  # the host's clock
        self.free_at = 0.0
        self.rate = rate  # an event clock that runs fast or slow

    def perf_counter(self) -> float:
        return self.now

    def launch(self, seconds: float) -> None:
        self.free_at = max(self.free_at, self.now) + seconds

    def wait_until(self, at: float) -> None:
        self.now = max(self.now, at)

    def synchronize(self) -> None:
        self.wait_until(self.free_at)


class Event:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.at = 0.0

    def record(self) -> None:
        self.at = max(self.stream.free_at, self.stream.now)

    def synchronize(self) -> None:
        self.stream.wait_until(self.at)

    def elapsed_time(self, end: Event) -> float:
        return (end.at - self.at) * 1e3 * self.stream.rate


class Rig:
    """The tool's Rig on the simulated stream."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=stream.synchronize))

    def compute(self) -> None:
        self.stream.launch(COMPUTE_S)

    def collective(self) -> None:
        self.stream.launch(GATHER_S)

    def event(self) -> Event:
        event = Event(self.stream)
        event.record()
        return event


class Timer:
    """The probe's CUDA-event timer on the simulated stream."""

    seconds = staticmethod(probe._CudaTimer.seconds)

    def __init__(self, stream: Stream, waits: bool = False) -> None:
        self.stream, self.waits = stream, waits

    def mark(self) -> Event:
        if self.waits:  # a probe that synchronises: the loop waits for the GPU
            self.stream.synchronize()
        event = Event(self.stream)
        event.record()
        return event


@pytest.fixture
def stream() -> Stream:
    return Stream()


@pytest.fixture
def tool(stream: Stream, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_tool("gpu_truth_probe")
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=stream.perf_counter))
    return module


def rank_probe(store: Path, timer: Timer) -> probe.Probe:
    who = Identity(job="truth", rank=0, world=1, local_rank=0, node="truth")
    one = probe.Probe(who, store, flush_interval_s=60)
    one._cuda = timer  # type: ignore[assignment]
    return one


def marks_and_wall(tool: Any, store: Path, rig: Rig, timer: Timer) -> list[dict[str, Any]]:
    one = rank_probe(store, timer)
    marks = tool.run_marks(rig, one, 8, 0)
    wall = tool.run_wall(rig, one, 8, 8)
    one.flush()
    records = tool.step_records(store, "truth")
    rows: list[dict[str, Any]] = tool.compare(
        "marks", marks, records, ("step_s", "compute_s", "comm_s"), tool.EVENT_TOL
    )
    return rows + tool.compare("wall", wall, records, ("step_s",), tool.WALL_TOL)


def test_a_right_probe_agrees_with_the_events_and_the_host_clock(
    tool: Any, stream: Stream, tmp_path: Path
) -> None:
    rows = marks_and_wall(tool, tmp_path, Rig(stream), Timer(stream))
    assert [(r["check"], r["field"]) for r in rows] == [
        ("marks", "step_s"),
        ("marks", "compute_s"),
        ("marks", "comm_s"),
        ("wall", "step_s"),
    ]
    assert all(r["ok"] and r["steps"] == 8 for r in rows), rows
    marks = {r["field"]: r for r in rows if r["check"] == "marks"}
    assert marks["compute_s"]["truth_ms"] == pytest.approx(1e3 * COMPUTE_S)
    assert marks["comm_s"]["probe_ms"] == pytest.approx(1e3 * GATHER_S)


def test_an_event_clock_off_the_hosts_fails_the_wall_check(
    tool: Any, stream: Stream, tmp_path: Path
) -> None:
    stream.rate = 1.1  # event durations read 10% long
    rows = marks_and_wall(tool, tmp_path, Rig(stream), Timer(stream))
    # The checker's events share the probe's clock, so only the host's clock can tell.
    assert [r["ok"] for r in rows] == [True, True, True, False], rows


def test_a_lost_step_record_fails_the_check(tool: Any) -> None:
    truths = [tool.Truth(n, 0.01, 0.008, 0.002) for n in range(3)]
    records = {n: {"step_s": 0.01, "compute_s": 0.008, "comm_s": 0.002} for n in (0, 2)}
    rows = tool.compare("marks", truths, records, ("step_s",), tool.EVENT_TOL)
    assert rows[0]["steps"] == 2 and rows[0]["agree"] == 1.0 and not rows[0]["ok"]


def test_the_loop_runs_ahead_of_the_gpu_unless_the_probe_waits(
    tool: Any, stream: Stream, tmp_path: Path
) -> None:
    rig = Rig(stream)
    ahead = tool.no_wait(rig, rank_probe(tmp_path, Timer(stream)), 10, 0)
    held = tool.no_wait(rig, rank_probe(tmp_path / "held", Timer(stream, waits=True)), 10, 0)
    assert ahead["ok"] and ahead["agree"] == 0.0, ahead  # (queueing takes no virtual time)
    assert not held["ok"] and held["agree"] == pytest.approx(1.0), held
    assert ahead["truth_ms"] == pytest.approx(1e3 * (COMPUTE_S + GATHER_S))


def test_ddp_steps_need_their_communication_mark(tool: Any) -> None:
    truths = [tool.Truth(n, 0.05, 0.0, 0.0) for n in range(4)]
    records = {n: {"step_s": 0.05, "comm_s": 0.01 if n else 0.0} for n in range(4)}
    step, marked = tool.ddp_rows(truths, records)
    assert step["ok"] and not marked["ok"] and marked["agree"] == 0.75
