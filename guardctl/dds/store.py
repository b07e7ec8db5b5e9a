"""The service's state on disk: SQLite in WAL mode, written in group commits.

Every change the ledger makes is queued here and written in one transaction
per batch (``flush``, or :class:`CommitProcess` in the running service); the
service answers a request only after the batch holding its change is
committed, so whatever a client was told survives a SIGKILL.
``synchronous=NORMAL`` in WAL mode loses nothing when the process dies; only a
power cut can lose the last few milliseconds of commits.

A batch is a list of statements, each with the rows of parameters it runs
for (``executemany``): the ordered statements (``write``) first, then the
keyed rows (``write_latest``), of which only the last per key is written.
Keyed rows are whole rows (an upsert or a delete of one row), so the last
one per key is the outcome of all of them, whatever the order between keys.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable, Hashable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from guardctl.errors import StoreError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- A shard's state is its leases': leased while one is active, done once one is (done_seq
-- orders the completions, for checkpoints). Writing only lease rows, which are appended in
-- grant order, keeps an operation's writes on the table's last few pages; a table of shard
-- states took a random page per operation (shards go out in shuffled order): 2.3 WAL
-- pages per lease + ack against 0.4, in the commits and the checkpoints (docs/dds.md).
CREATE TABLE IF NOT EXISTS lease (
    lease_id INTEGER PRIMARY KEY, request_id TEXT NOT NULL, worker TEXT NOT NULL,
    epoch INTEGER NOT NULL, shard INTEGER NOT NULL, gen INTEGER NOT NULL,
    granted REAL NOT NULL, expires REAL NOT NULL,
    state TEXT NOT NULL,              -- active | done | expired | revoked
    done_seq INTEGER);                -- the completion's number, once done
-- request_id is not indexed: the ledger loads every lease and looks request ids up in
-- memory, and an index of random ids cost a page write per lease (about 40 % of a commit).
-- Nor is done_seq: only a restore looks for it, and reloads every lease anyway (0.2 s for
-- the one, 12 s for the other at 1.5 million leases).
CREATE INDEX IF NOT EXISTS lease_state ON lease (state);
CREATE TABLE IF NOT EXISTS checkpoint (
    name TEXT PRIMARY KEY, ord INTEGER NOT NULL, seq INTEGER NOT NULL,
    step INTEGER, gen INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS step (step INTEGER PRIMARY KEY, shares TEXT NOT NULL);
-- A restore's answer by its request id, written in the restore's own transaction: a client
-- retrying it, even after the service restarted, gets the same generation, not a second one.
CREATE TABLE IF NOT EXISTS restore (request_id TEXT PRIMARY KEY, reply TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS worker (
    worker TEXT PRIMARY KEY, rank INTEGER, speed REAL, samples INTEGER NOT NULL,
    seconds REAL NOT NULL, shards INTEGER NOT NULL, last_step INTEGER, last_seen REAL NOT NULL);
"""

Params = tuple[Any, ...]
Batch = list[tuple[str, list[Params]]]  # each statement with the rows it runs for, in order
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
CHECKPOINT_S = 0.05  # how often the commit process's checkpointer copies the WAL over
# WAL pages (256 MiB at 4 KiB) past which the log is made to start over. Each such pass holds
# the commits for 4-8 ms (its syncs); at 10k operations/s the log grows by about 27 000 pages a
# second, so at 8192 pages the passes held the commits 2 % of the time, enough to move the
# 99th percentile of the answers (bench/dds_throughput.py).
WAL_CAP_FRAMES = 65536


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _commit(conn: sqlite3.Connection, batch: Batch) -> int:
    """Write *batch* in one transaction, all or nothing; return how many statements."""
    count = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sql, rows in batch:
            if len(rows) == 1:
                conn.execute(sql, rows[0])
            else:
                conn.executemany(sql, rows)
            count += len(rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return count


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a database written by an earlier version to this schema, in one transaction.

    Before, a ``shard`` table held each leased or done shard, with the
    completion's number; the number moves into the lease that completed it
    (the leases' states already said the rest) and the table goes.
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(lease)")}
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "done_seq" in columns and "shard" not in tables:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if "done_seq" not in columns:
            conn.execute("ALTER TABLE lease ADD COLUMN done_seq INTEGER")
        if "shard" in tables:
            conn.execute(
                "UPDATE lease SET done_seq = (SELECT s.done_seq FROM shard s "
                "WHERE s.lease_id = lease.lease_id AND s.state = 'done') WHERE state = 'done'"
            )
            conn.execute("DROP TABLE shard")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class StateDB:
    """One SQLite connection plus the queue of writes waiting for the next group commit."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        try:
            if readonly:
                self.conn = sqlite3.connect(
                    f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=5.0
                )
            else:
                self.conn = _connect(path)
                self.conn.executescript(SCHEMA)
                _migrate(self.conn)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the service state {path}: {exc}") from exc
        self._writes: Batch = []  # in order; a run of the same statement shares one entry
        self._latest: dict[Hashable, tuple[str, Params]] = {}
        # Called before this connection writes: lets a commit process finish its batch first.
        self.before_flush: Callable[[], None] | None = None

    @property
    def dirty(self) -> bool:
        return bool(self._writes or self._latest)

    def write(self, sql: str, params: Params = ()) -> None:
        """Queue one statement for the next commit, after those queued before it."""
        writes = self._writes
        if writes and writes[-1][0] == sql:
            writes[-1][1].append(params)
        else:
            writes.append((sql, [params]))

    def write_latest(self, key: Hashable, sql: str, params: Params) -> None:
        """Queue a whole-row upsert or delete of which only the last per *key* in a batch matters.

        Written after the batch's ordered statements: a statement that must see
        these rows (or that they must not undo) is queued after a ``flush``.
        """
        self._latest[key] = (sql, params)

    def take(self) -> Batch:
        """Hand over every queued statement (for a :class:`CommitProcess`), in order."""
        batch, self._writes = self._writes, []
        if self._latest:
            groups: dict[str, list[Params]] = {}
            for sql, params in self._latest.values():
                rows = groups.get(sql)
                if rows is None:
                    groups[sql] = [params]
                else:
                    rows.append(params)
            self._latest = {}
            batch.extend(groups.items())
        return batch

    def flush(self) -> int:
        """Write every queued statement in one transaction; return how many."""
        if self.before_flush is not None:
            self.before_flush()  # an earlier batch in another process commits first
        if not self.dirty:
            return 0
        return _commit(self.conn, self.take())

    def rows(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the service state {self.path}: {exc}") from exc

    def meta(self) -> dict[str, str]:
        return dict(self.rows("SELECT key, value FROM meta"))

    def set_meta(self, key: str, value: str) -> None:
        self.write("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def close(self) -> None:
        self.conn.close()


class CommitProcess:
    """A child process that commits the service's batches, one at a time and in order.

    The event loop hands over a batch and carries on parsing and answering
    other requests while SQLite writes it on the other core (and a thread of
    the child, :class:`Checkpointer`, copies the WAL into the database); the
    answers that rest on a batch are released only when the child reports it
    committed. The child is forked
    before the service opens anything, holds no state of its own, and dies
    with the service (``PR_SET_PDEATHSIG``): it never commits for a service
    that is gone, and it keeps the inherited service lock until it is gone.
    """

    def __init__(self, path: Path) -> None:
        for stream in (sys.stdout, sys.stderr):  # else the child would write them out again
            stream.flush()
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_commit_loop, args=(path, child, os.getpid()), name="dds-commit", daemon=True
        )
        self.process.start()
        child.close()

    def fileno(self) -> int:
        return self.conn.fileno()

    def send(self, batch: Batch) -> None:
        try:
            self.conn.send(batch)
        except (OSError, ValueError) as exc:
            raise StoreError(f"the commit process is gone: {exc}") from exc

    def ready(self) -> bool:
        """Whether a report (or the end of the pipe) is there to read without waiting."""
        try:
            return self.conn.poll()
        except (OSError, ValueError):
            return True  # closed or broken: the next read says so

    def result(self) -> int:
        """Wait for the batch in flight: how many statements it committed (StoreError if none)."""
        try:
            reply = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise StoreError("the commit process is gone") from exc
        if isinstance(reply, str):
            raise StoreError(reply)
        return int(reply)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _die_with(parent: int) -> None:
    """Be killed by the kernel when *parent* dies; leave now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


class Checkpointer(threading.Thread):
    """Copies the WAL into the database beside the commits, so that no commit waits for it.

    Left to itself, SQLite checkpoints inside the commit that takes the WAL
    past 1000 pages: under load that was every few dozen commits, and those
    commits took 5-10 ms instead of 0.1 (with their answers waiting on them).
    Here the committing connection never checkpoints; this thread, with a
    connection of its own, runs passive checkpoints, which copy what is
    committed without holding up the writer. A writer starts the log over only
    when everything in it has been copied, which under steady commits never
    happens by chance; so once the log passes ``WAL_CAP_FRAMES`` pages, the
    thread copies the rest while holding *writes* (the lock the commits take):
    a short pass, after which the next commit starts the log over.
    """

    def __init__(self, path: Path, writes: threading.Lock) -> None:
        super().__init__(name="dds-checkpoint", daemon=True)
        self.path = path
        self.writes = writes
        self.stopping = threading.Event()
        self.passes = 0
        self.restarts = 0

    def run(self) -> None:
        conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=5.0)
        try:
            while not self.stopping.wait(CHECKPOINT_S):
                self.checkpoint(conn)
        finally:
            conn.close()

    def checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            _busy, pages, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.passes += 1
            if pages >= WAL_CAP_FRAMES:
                with self.writes:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                self.restarts += 1
        except sqlite3.Error as exc:  # a failing disk fails the commits too, which stop the service
            print(f"dds: checkpoint of {self.path} failed: {exc}", file=sys.stderr)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


def _commit_loop(path: Path, conn: Connection, parent: int) -> None:
    _die_with(parent)
    # Stopping is the service's business: it sends None (or dies, and so do we).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    db: sqlite3.Connection | None = None
    writes = threading.Lock()
    checkpointer: Checkpointer | None = None
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            break
        if os.getppid() != parent:  # the service died while sending: answer nobody
            return
        try:
            if db is None:
                db = _connect(path)
                db.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's job
                checkpointer = Checkpointer(path, writes)
                checkpointer.start()
            with writes:
                count = _commit(db, batch)
            if checkpointer is not None and not checkpointer.is_alive():
                # It died (and said why on stderr): let SQLite checkpoint in the commits again
                # rather than let the log grow.
                db.execute("PRAGMA wal_autocheckpoint=1000")
                checkpointer = None
        except Exception as exc:  # the service stops on it: say what failed
            conn.send(f"cannot write the service state {path}: {exc}")
            continue
        conn.send(count)
    if checkpointer is not None:
        checkpointer.stop()
    if db is not None:
        db.close()
