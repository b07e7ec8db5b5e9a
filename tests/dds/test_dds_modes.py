"""How the service was started decides its mode: a request of the other mode is refused and
changes nothing, also across restarts (a stray pull request must not lock a per-step job)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from dds_helpers import ServiceProcess

from guardctl.config import load_settings
from guardctl.dds import Client
from guardctl.dds.client import RequestRejected
from guardctl.dds.dataset import JobSpec, index_range
from guardctl.dds.ledger import ConflictError, Ledger
from guardctl.dds.store import StateDB


def per_step_ledger(path: Path) -> Ledger:
    spec = JobSpec(index_range(40), 10, 1, global_batch=8)
    return Ledger(StateDB(path / "s.sqlite"), spec, lease_s=5.0, clock=lambda: 1000.0)


def stored(path: Path) -> tuple[str | None, int]:
    with sqlite3.connect(path / "s.sqlite") as conn:
        mode = conn.execute("SELECT value FROM meta WHERE key = 'mode'").fetchone()
        (leases,) = conn.execute("SELECT COUNT(*) FROM lease").fetchone()
    return (mode[0] if mode else None), leases


def test_a_stray_lease_on_a_per_step_job_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    ledger = per_step_ledger(tmp_path)
    with pytest.raises(ConflictError, match="--global-batch"):
        ledger.lease("stray", "a")
    ledger.db.flush()
    assert stored(tmp_path) == (None, 0)  # no mode taken, no lease granted
    assert ledger.step("r0", 0, 2, 0)["status"] == "ok"
    ledger.db.flush()
    ledger.db.close()
    ledger = per_step_ledger(tmp_path)  # restarted: still per step, still refusing leases
    assert ledger.step("r0", 0, 2, 1)["status"] == "ok"
    with pytest.raises(ConflictError, match="next_batch"):
        ledger.lease("stray", "b")
    ledger.db.flush()
    assert stored(tmp_path) == ("step", 0)


def test_a_per_step_job_locked_by_an_earlier_service_is_freed(tmp_path: Path) -> None:
    ledger = per_step_ledger(tmp_path)
    ledger.db.set_meta("mode", "pull")  # what a service that took the first request's mode kept
    ledger.db.flush()
    ledger.db.close()
    ledger = per_step_ledger(tmp_path)
    assert ledger.step("r0", 0, 2, 0)["share"] == 4
    ledger.db.flush()
    assert stored(tmp_path) == ("step", 0)


def test_a_pull_job_refuses_per_step_requests(tmp_path: Path) -> None:
    spec = JobSpec(index_range(40), 10, 1)
    ledger = Ledger(StateDB(tmp_path / "s.sqlite"), spec, lease_s=5.0, clock=lambda: 1000.0)
    with pytest.raises(ConflictError, match="per-step requests need a service started with"):
        ledger.step("r0", 0, 2, 0)
    assert ledger.lease("w", "a")["status"] == "leased"


def test_the_service_refuses_a_stray_lease_and_serves_steps_across_a_restart(
    start_service: Callable[..., ServiceProcess],
) -> None:
    service = start_service(
        "6101", "--records", "1000", "--shard-size", "50", "--global-batch", "100"
    )
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    stray = Client(service.job, worker="stray", settings=settings, retry_s=5)
    with pytest.raises(RequestRejected, match="started with --global-batch") as refused:
        stray.lease()
    assert refused.value.exit_code == 2
    rank = Client(service.job, worker="r0", rank=0, world=1, settings=settings, prefetch=False)
    first = rank.next_batch(0)
    assert first is not None and first.share == 100
    service.kill()
    service.start(with_dataset=False)  # resumes from its database: no --global-batch repeated
    with pytest.raises(RequestRejected, match="next_batch"):
        stray.lease()
    second = rank.next_batch(1)
    assert second is not None and (second.step, second.share) == (1, 100)
    with service.db() as conn:
        assert conn.execute("SELECT COUNT(*) FROM lease").fetchone() == (0,)
        assert conn.execute("SELECT value FROM meta WHERE key = 'mode'").fetchone() == ("step",)
