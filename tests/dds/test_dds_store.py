"""The state database's batches: statements in order, and only the last whole row per key."""

from __future__ import annotations

from pathlib import Path

from guardctl.dds.ledger import WORKER_ROW
from guardctl.dds.store import StateDB

META = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"
UNMETA = "DELETE FROM meta WHERE key = ?"


def _worker(name: str, shards: int) -> tuple[object, ...]:
    return (name, None, 1.0, 10 * shards, 1.0, shards, None, 1000.0 + shards)


def test_a_batch_keeps_the_order_and_the_last_row_per_key(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "s.sqlite")
    db.write(META, ("a", "1"))
    db.write(META, ("b", "2"))  # a run of one statement shares one entry
    db.write(UNMETA, ("a",))
    db.write(META, ("a", "3"))
    for shards in range(3):
        db.write_latest(("worker", "w1"), WORKER_ROW, _worker("w1", shards))
    db.write_latest(("worker", "w2"), WORKER_ROW, _worker("w2", 7))
    assert db.dirty
    batch = db.take()
    assert batch == [
        (META, [("a", "1"), ("b", "2")]),
        (UNMETA, [("a",)]),
        (META, [("a", "3")]),
        (WORKER_ROW, [_worker("w1", 2), _worker("w2", 7)]),
    ]
    assert not db.dirty and db.take() == []


def test_a_flush_writes_the_outcome_of_the_batch(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "s.sqlite")
    db.write(META, ("a", "1"))
    db.write(UNMETA, ("a",))
    db.write(META, ("b", "2"))
    db.write_latest(("worker", "w1"), WORKER_ROW, _worker("w1", 1))
    db.write_latest(("worker", "w1"), WORKER_ROW, _worker("w1", 2))
    assert db.flush() == 4
    assert db.meta() == {"b": "2"}
    assert db.rows("SELECT worker, shards FROM worker") == [("w1", 2)]
    db.close()
