"""A data-sharding restore retried after the service restarted: the same generation, and no
shard completed since is handed out again (trained twice). The answer is kept in the database,
in the restore's own transaction; a database from before that table is taken over on open."""

from __future__ import annotations

import http.client
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

DDS_TESTS = str(Path(__file__).resolve().parents[1] / "dds")
if DDS_TESTS not in sys.path:
    sys.path.insert(0, DDS_TESTS)

from dds_helpers import ServiceProcess  # noqa: E402

from guardctl.config import load_settings  # noqa: E402
from guardctl.dds import Client  # noqa: E402
from guardctl.dds.dataset import JobSpec, index_range  # noqa: E402
from guardctl.dds.ledger import Ledger  # noqa: E402
from guardctl.dds.store import StateDB  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SPEC = JobSpec(index_range(50), 10, 1, seed=3)  # five shards


def _open(path: Path, clock: Clock) -> Ledger:
    return Ledger(StateDB(path / "state.sqlite"), SPEC, lease_s=5.0, clock=clock)


def _restart(ledger: Ledger, path: Path, clock: Clock) -> Ledger:
    """What a service restart does to the ledger: its memory gone, the database read anew."""
    ledger.db.flush()
    ledger.db.close()
    return _open(path, clock)


def _done(ledger: Ledger, worker: str, request: str) -> int:
    lease = ledger.lease(worker, request)
    assert ledger.ack(lease["lease"])["counted"]
    return int(lease["shard"])


def _left(ledger: Ledger) -> list[int]:
    """Lease and complete every shard still to do; the shards handed out."""
    out = []
    while (lease := ledger.lease("w", f"rest{len(out)}"))["status"] == "leased":
        assert ledger.ack(lease["lease"])["counted"]
        out.append(int(lease["shard"]))
    return out


def test_a_restore_retried_after_a_restart_gets_the_same_generation(tmp_path: Path) -> None:
    clock = Clock()
    ledger = _open(tmp_path, clock)
    first = _done(ledger, "w", "a")
    ledger.commit("ck")
    undone = _done(ledger, "w", "b")  # after the checkpoint: the restore requeues it
    reply = ledger.restore("ck", "R1")
    assert (reply["gen"], reply["requeued"]) == (1, 1)
    again = _done(ledger, "w", "c")  # the requeued shard, trained again once, as it must be
    assert again == undone
    ledger = _restart(ledger, tmp_path, clock)
    assert ledger.restore("ck", "R1") == reply  # the client's retry: answered, nothing more
    assert ledger.gen == 1
    rest = _left(ledger)
    assert again not in rest and first not in rest, "a completed shard was handed out again"
    assert sorted([first, again, *rest]) == list(range(5))


def test_the_answer_is_committed_with_the_restore(tmp_path: Path) -> None:
    clock = Clock()
    ledger = _open(tmp_path, clock)
    _done(ledger, "w", "a")
    ledger.commit("ck")
    reply = ledger.restore("ck", "R1")
    # Straight from the file, not through the ledger: the answer is there once it returned.
    with sqlite3.connect(tmp_path / "state.sqlite") as conn:
        (stored,) = conn.execute("SELECT reply FROM restore WHERE request_id = 'R1'").fetchone()
        (gen,) = conn.execute("SELECT value FROM meta WHERE key = 'gen'").fetchone()
    assert json.loads(stored) == reply and gen == "1"
    other = ledger.restore("ck", "R2")  # another request: another restore
    assert other["gen"] == 2


def test_a_database_without_the_restore_table_is_taken_over(tmp_path: Path) -> None:
    clock = Clock()
    ledger = _open(tmp_path, clock)
    first = _done(ledger, "w", "a")
    ledger.commit("ck")
    ledger.db.flush()
    ledger.db.close()
    with sqlite3.connect(tmp_path / "state.sqlite") as conn:  # what the version before wrote
        conn.execute("DROP TABLE restore")
    ledger = _open(tmp_path, clock)
    reply = ledger.restore("ck", "R1")
    ledger = _restart(ledger, tmp_path, clock)
    assert ledger.restore("ck", "R1") == reply and ledger.gen == 1
    assert first not in _left(ledger)


# -- the real service process, SIGKILLed and started again between a restore and its retry ----


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(tmp_path, "9101", ["--records", "50", "--shard-size", "10"], 30.0)
    proc.start()
    yield proc
    proc.stop()


def _post(service: ServiceProcess, path: str, body: dict[str, object]) -> dict[str, object]:
    address = service.address()
    assert address is not None
    secret = (service.dir / "secret").read_text().strip()
    conn = http.client.HTTPConnection(address[0], address[1], timeout=10)
    conn.request(
        "POST", path, body=json.dumps(body).encode(), headers={"Authorization": f"Bearer {secret}"}
    )
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    assert response.status == 200, payload
    return dict(payload)


def test_a_restore_retried_across_a_service_restart_is_answered_once(
    service: ServiceProcess,
) -> None:
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    client = Client(service.job, worker="w", settings=settings)
    shard = client.lease()
    assert shard is not None and client.ack(shard)
    client.commit("ck")
    later = client.lease()
    assert later is not None and client.ack(later)
    reply = _post(service, "/v1/restore", {"checkpoint": "ck", "request_id": "R1"})
    assert (reply["gen"], reply["requeued"]) == (1, 1)
    again = client.lease()  # the requeued shard, trained again once
    assert again is not None and again.shard == later.shard and client.ack(again)
    client.close()
    service.kill()  # before the client saw the answer, as far as the client knows
    service.start(with_dataset=False)
    assert _post(service, "/v1/restore", {"checkpoint": "ck", "request_id": "R1"}) == reply
    with service.db() as conn:
        (gen,) = conn.execute("SELECT value FROM meta WHERE key = 'gen'").fetchone()
        done = conn.execute(
            "SELECT shard, COUNT(*) FROM lease WHERE state = 'done' GROUP BY shard"
        ).fetchall()
    assert gen == "1"
    assert dict(done) == {shard.shard: 1, later.shard: 1}, "a completed shard was revoked again"
    client = Client(service.job, worker="w2", settings=settings)
    rest = []
    while (lease := client.lease()) is not None:
        assert client.ack(lease)
        rest.append(lease.shard)
    client.close()
    assert sorted([shard.shard, later.shard, *rest]) == list(range(5))
