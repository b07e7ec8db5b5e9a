"""What a step record says: samples and the rank's parallel role; probe.last()."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guardctl import probe
from guardctl.telemetry.schema import read_path


@pytest.fixture(autouse=True)
def fresh_probe() -> Iterator[None]:
    yield
    probe.flush()
    probe._default = None


def test_samples_and_role_are_written(tmp_path: Path) -> None:
    probe.configure(
        store=tmp_path,
        job="5",
        rank=3,
        node="n2",
        flush_interval_s=60,
        pp_stage=1,
        dp_rank=1,
        tp_rank=0,
    )
    with probe.step(samples=32):
        probe.comm_begin()
    with probe.step():
        probe.samples(7)
    with probe.step():
        pass
    assert probe.flush()
    records = sorted(read_path(tmp_path / "steps").records, key=lambda r: r["step"])
    assert [r.get("samples") for r in records] == [32, 7, None]
    assert {(r["pp_stage"], r["dp_rank"], r["tp_rank"]) for r in records} == {(1, 1, 0)}


def test_a_role_without_a_dimension_is_left_out(tmp_path: Path) -> None:
    probe.configure(store=tmp_path, job="5", rank=0, node="n1", flush_interval_s=60, pp_stage=2)
    with probe.step():
        pass
    probe.flush()
    (record,) = read_path(tmp_path / "steps").records
    assert record["pp_stage"] == 2 and "dp_rank" not in record and "tp_rank" not in record


def test_a_negative_role_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        probe.configure(store=tmp_path, job="5", rank=0, node="n1", pp_stage=-1)


def test_last_gives_the_last_steps_times(tmp_path: Path) -> None:
    probe.configure(store=tmp_path, job="5", rank=0, node="n1", flush_interval_s=60)
    assert probe.last() is None
    with probe.step(41, samples=8):
        time.sleep(0.03)
        probe.comm_begin()
        time.sleep(0.01)
    last = probe.last()
    assert last is not None and last.step == 41 and last.samples == 8
    assert 0.03 <= last.compute_s < last.step_s and last.comm_s >= 0.01
    assert last.step_s == pytest.approx(last.compute_s + last.comm_s)


def test_time_in_collectives_is_summed_and_the_rest_is_compute(tmp_path: Path) -> None:
    probe.configure(store=tmp_path, job="5", rank=0, node="n1", flush_interval_s=60)
    with probe.step():
        with probe.comm():  # a gather before a unit's forward
            time.sleep(0.02)
        time.sleep(0.03)  # the rank's own work between its collectives
        with probe.comm():
            time.sleep(0.02)
        time.sleep(0.015)
        probe.comm_add(0.015)  # a collective timed by the caller
        probe.comm_begin()  # a mark is ignored once collectives were timed
    last = probe.last()
    assert last is not None
    assert last.comm_s >= 0.055 and last.compute_s >= 0.03
    assert last.compute_s < last.step_s - 0.05  # the collectives are not compute
    assert last.step_s == pytest.approx(last.compute_s + last.comm_s)
    probe.flush()
    (record,) = read_path(tmp_path / "steps").records
    assert record["comm_s"] == pytest.approx(last.comm_s, abs=1e-6)
    assert record["compute_s"] == pytest.approx(last.compute_s, abs=1e-6)


def test_each_step_sums_only_its_own_collectives(tmp_path: Path) -> None:
    probe.configure(store=tmp_path, job="5", rank=0, node="n1", flush_interval_s=60)
    probe.comm_add(5.0)  # outside a step: dropped
    with probe.step():
        probe.comm_add(0.001)
    first = probe.last()
    with probe.step():  # no collective timed: the single-mark rule again
        time.sleep(0.02)
        probe.comm_begin()
    second = probe.last()
    assert first is not None and second is not None
    assert first.comm_s == pytest.approx(min(0.001, first.step_s))
    assert second.compute_s >= 0.02 and second.step_s == pytest.approx(
        second.compute_s + second.comm_s
    )
    assert second.comm_s < 0.01


def test_more_collective_time_than_the_step_is_all_communication(tmp_path: Path) -> None:
    probe.configure(store=tmp_path, job="5", rank=0, node="n1", flush_interval_s=60)
    with probe.step():
        probe.comm_add(10.0)  # e.g. host seconds of a launch that overlapped the previous step
        probe.comm_add(-1.0)  # a clock that went backwards adds nothing
    last = probe.last()
    assert last is not None and last.compute_s == 0.0 and last.comm_s == last.step_s


class HostClockEvents:
    """Stands in for the probe's CUDA-event timer (no GPU here): a mark is a clock reading,
    and ``seconds`` is only called when a duration is asked for, as with events."""

    def __init__(self) -> None:
        self.asked = 0

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        self.asked += 1
        return end - start


def test_with_events_collectives_are_summed_when_the_times_are_read(tmp_path: Path) -> None:
    one = probe.configure(store=tmp_path, job="5", rank=0, node="n1", flush_interval_s=60)
    events = HostClockEvents()
    one._cuda = events  # type: ignore[assignment]
    with probe.step():
        for _ in range(2):
            with probe.comm():
                time.sleep(0.02)
        time.sleep(0.02)
    assert events.asked == 0  # the training loop never waits for events
    last = probe.last()
    assert last is not None and events.asked == 3  # the step and the two collectives
    assert last.comm_s >= 0.04 and 0.02 <= last.compute_s < last.step_s - 0.04
