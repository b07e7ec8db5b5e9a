"""Fast tests of the ski-rental rule, the impact arithmetic and the leader lease."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guardctl.analyze.impact import describe, job_impact
from guardctl.controller.lease import Holder, Lease, may_take
from guardctl.controller.requeue import decide, restart_cost_s
from guardctl.sections.control import ControlSettings

CFG = ControlSettings(checkpoint_interval_s=1800, restart_s=300, queue_wait_s=300)


def test_restart_cost_is_half_a_checkpoint_interval_plus_restart_and_queue() -> None:
    assert restart_cost_s(CFG) == 1500
    assert restart_cost_s(CFG, queue_wait_s=0) == 1200  # Slurm's own estimate wins


@pytest.mark.parametrize(
    ("slow_for_h", "left_h", "requeue"),
    [
        (1.0, None, False),  # paid 1.6 GPU-h of a 3.33 price: keep renting
        (2.5, None, True),  # paid 4.0: buy
        (2.5, 0.5, False),  # only 0.8 GPU-h left to lose: let it finish
        (2.5, 10.0, True),
    ],
)
def test_ski_rental(slow_for_h: float, left_h: float | None, requeue: bool) -> None:
    r = decide(0.2, 8, slow_for_h * 3600, None if left_h is None else left_h * 3600, CFG)
    assert r.requeue is requeue, r.why
    assert round(r.price, 3) == 3.333


def test_no_slowdown_never_requeues() -> None:
    assert not decide(0.0, 8, 1e9, None, CFG).requeue


def test_impact_is_the_gap_to_the_next_busiest_rank() -> None:
    i = job_impact("40117", [9.0, 7.1], [7.0, 7.2, 6.9], step_s=12.0, gpus=1536)
    assert i is not None
    assert i.fraction == pytest.approx(1.8 / 12.0)
    assert i.step_s_without == pytest.approx(10.2)
    assert i.as_dict()["pct"] == 15.0
    assert describe("node17", i.as_dict()) == "node17 costs job 40117 15%, 5530 GPU-h/day"
    # A node no slower than the rest costs nothing; no step data: no impact.
    faster = job_impact("j", [6.0], [7.0], 10.0, 8)
    assert faster is not None and faster.fraction == 0
    assert job_impact("j", [], [7.0], 10.0, 8) is None


def test_lease_rule() -> None:
    other = Holder("h1", 1, "a", renewals=4, lease_s=30.0, expires=150.0)
    assert may_take(None, 0.0, 30.0, gone=False)  # never held
    assert not may_take(other, 29.9, 30.0, gone=False)  # renewed within lease_s, as seen here
    assert may_take(other, 30.0, 30.0, gone=False)  # no renewal seen for lease_s
    assert may_take(other, 0.0, 30.0, gone=True)  # its holder, of this machine, is gone
    released = Holder.from_dict({**other.as_dict(), "expires": 0.0})  # as an older one wrote it
    assert released.released and may_take(released, 0.0, 30.0, gone=False)


def test_lease_file_is_taken_renewed_refused_and_released(tmp_path: Path) -> None:
    a, b = Lease(tmp_path, 30.0), Lease(tmp_path, 30.0)
    held, holder = a.acquire()
    assert held and holder is not None and holder.pid == os.getpid()
    assert b.acquire()[0] is False  # same host, holder alive (this process), not expired
    assert a.acquire()[0] is True
    a.release()
    assert b.acquire()[0] is True
    raw = json.loads((tmp_path / "control" / "lease.json").read_text())
    assert raw["token"] == b.token and raw["expires"] > raw["since"]


def test_a_dead_holder_on_this_host_loses_the_lease(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from guardctl.controller.lease import Lease;"
        f"print(Lease(Path({str(tmp_path)!r}), 3600.0).acquire()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.strip() == "True"
    held, holder = Lease(tmp_path, 30.0).acquire()
    assert held and holder is not None and holder.pid == os.getpid()


def test_a_torn_lease_file_is_held(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "lease.json").write_text('{"host": "h1", "pid"')
    lease = Lease(tmp_path, 30.0)
    assert not lease.acquire()[0] and "garbled" in lease.why
