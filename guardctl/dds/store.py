"""The service's state on disk: SQLite in WAL mode, written in group commits.

Every change the ledger makes is queued here and written in one transaction
per batch (``flush``); the service answers a request only after the batch
holding its change is committed, so whatever a client was told survives a
SIGKILL. ``synchronous=NORMAL`` in WAL mode loses nothing when the process
dies; only a power cut can lose the last few milliseconds of commits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from guardctl.errors import StoreError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shard (
    epoch INTEGER NOT NULL, shard INTEGER NOT NULL,
    state TEXT NOT NULL,              -- leased | done (absent: queued)
    lease_id INTEGER NOT NULL, done_seq INTEGER, worker TEXT NOT NULL,
    PRIMARY KEY (epoch, shard)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lease (
    lease_id INTEGER PRIMARY KEY, request_id TEXT UNIQUE, worker TEXT NOT NULL,
    epoch INTEGER NOT NULL, shard INTEGER NOT NULL, gen INTEGER NOT NULL,
    granted REAL NOT NULL, expires REAL NOT NULL,
    state TEXT NOT NULL);             -- active | done | expired | revoked
CREATE INDEX IF NOT EXISTS lease_state ON lease (state);
CREATE TABLE IF NOT EXISTS checkpoint (
    name TEXT PRIMARY KEY, ord INTEGER NOT NULL, seq INTEGER NOT NULL,
    step INTEGER, gen INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS step (step INTEGER PRIMARY KEY, shares TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS worker (
    worker TEXT PRIMARY KEY, rank INTEGER, speed REAL, samples INTEGER NOT NULL,
    seconds REAL NOT NULL, shards INTEGER NOT NULL, last_step INTEGER, last_seen REAL NOT NULL);
"""

Params = tuple[Any, ...]


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
                self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=5.0)
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                self.conn.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the service state {path}: {exc}") from exc
        self._writes: list[tuple[str, Params]] = []
        self._latest: dict[Hashable, tuple[str, Params]] = {}

    @property
    def dirty(self) -> bool:
        return bool(self._writes or self._latest)

    def write(self, sql: str, params: Params = ()) -> None:
        """Queue one statement for the next commit."""
        self._writes.append((sql, params))

    def write_latest(self, key: Hashable, sql: str, params: Params) -> None:
        """Queue a statement that only the last one per *key* in a batch matters (an upsert)."""
        self._latest[key] = (sql, params)

    def flush(self) -> int:
        """Write every queued statement in one transaction; return how many."""
        if not self.dirty:
            return 0
        batch = self._writes + list(self._latest.values())
        self._writes, self._latest = [], {}
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in batch:
                conn.execute(sql, params)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return len(batch)

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
