"""The state database's batches: statements in order, and only the last whole row per key;
the commit process's WAL stays bounded."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from guardctl.dds import store
from guardctl.dds.ledger import WORKER_ROW
from guardctl.dds.store import Checkpointer, CommitProcess, StateDB

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


def _wal_pages(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size // 4096 if wal.exists() else 0


def test_the_wal_starts_over_under_steady_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits never checkpoint and never stop: without the checkpointer's capped pass the
    log would only grow (here to about 6 000 pages)."""
    monkeypatch.setattr(store, "WAL_CAP_FRAMES", 300)  # the commit process is forked after
    monkeypatch.setattr(store, "CHECKPOINT_S", 0.005)
    path = tmp_path / "s.sqlite"
    StateDB(path).close()  # the schema
    writer = CommitProcess(path)
    try:
        largest, keys = 0, set[str]()
        for n in range(600):  # about 10 pages per batch: random keys, long values
            rows = [(f"k{(n * 7919 + i) % 5000}", "v" * 300) for i in range(10)]
            keys.update(key for key, _ in rows)
            writer.send([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)])
            assert writer.result() == 10
            largest = max(largest, _wal_pages(path))
    finally:
        writer.close()
    # The file's size is its high-water mark. Bounded, not exact: on a loaded machine the
    # checkpointer thread may miss many commits (969 pages seen at load 5 on 2 cores, 1 885 at
    # load 7); unbounded, the log ends near 6 000. Half of that still tells the two apart.
    assert largest < 10 * 300
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM meta").fetchone()[0] == len(keys)


def test_without_its_checkpointer_the_commit_process_checkpoints_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Checkpointer, "run", lambda self: None)  # it dies at once
    path = tmp_path / "s.sqlite"
    StateDB(path).close()
    writer = CommitProcess(path)
    try:
        largest = 0
        for n in range(600):
            rows = [(f"k{(n * 7919 + i) % 5000}", "v" * 300) for i in range(10)]
            writer.send([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)])
            assert writer.result() == 10
            largest = max(largest, _wal_pages(path))
    finally:
        writer.close()
    assert largest < 1500  # SQLite's own 1000-page checkpoints, not 6 000 pages


def test_the_checkpointer_copies_the_log_and_holds_the_writes_for_its_last_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "WAL_CAP_FRAMES", 1)
    path = tmp_path / "s.sqlite"
    db = StateDB(path)
    db.conn.execute("PRAGMA wal_autocheckpoint=0")
    for n in range(50):
        db.set_meta(f"k{n}", "v")
        db.flush()
    writes = threading.Lock()
    checkpointer = Checkpointer(path, writes)
    conn = sqlite3.connect(path, check_same_thread=False)
    writes.acquire()  # a commit in progress: the capped pass waits for it
    capped = threading.Thread(target=checkpointer.checkpoint, args=(conn,))
    capped.start()
    time.sleep(0.2)
    assert checkpointer.passes == 1 and checkpointer.restarts == 0 and capped.is_alive()
    writes.release()
    capped.join(timeout=5)
    assert checkpointer.restarts == 1
    db.set_meta("after", "v")
    db.flush()  # this commit starts the log over: one transaction's pages in it
    _busy, pages, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert 0 < pages < 10
    conn.close()
    db.close()


def test_a_report_taken_by_a_drain_does_not_stop_the_loop(tmp_path: Path) -> None:
    """The loop saw the commit process's pipe readable, and a handler that ran first in the
    same turn (a restore: it commits here, draining the batch in flight) took the report.
    The reader callback then runs anyway: it must not wait on the empty pipe."""
    import asyncio

    from guardctl.dds.service import GroupCommit

    path = tmp_path / "s.sqlite"
    db = StateDB(path)
    writer = CommitProcess(path)
    result = writer.result

    would_block: list[bool] = []

    def result_that_would_not_block() -> int:  # say so, where the loop would hang for good
        if not writer.conn.poll(0.5):
            would_block.append(True)
            raise RuntimeError("read a report that is not there")
        return result()

    writer.result = result_that_would_not_block  # type: ignore[method-assign]
    released: list[object] = []

    async def turn() -> None:
        loop = asyncio.get_running_loop()
        committer = GroupCommit(db, 0.0, writer)
        db.set_meta("a", "1")
        assert committer.after(released.append)
        await asyncio.sleep(0)  # the batch goes to the commit process
        assert committer.in_flight

        def block_until_reported() -> None:
            assert writer.conn.poll(5)  # the report is there: the next poll sees the pipe
            loop.call_soon(db.flush)  # ...and this runs before its reader in that turn

        loop.call_soon(block_until_reported)
        for _ in range(5):
            await asyncio.sleep(0)
        db.set_meta("b", "2")  # the loop goes on: later batches are answered
        assert committer.after(released.append)
        for _ in range(200):
            if len(released) == 2:
                break
            await asyncio.sleep(0.01)
        committer.close()

    try:
        asyncio.run(turn())
    finally:
        db.close()
    assert not would_block
    assert released == [None, None]
