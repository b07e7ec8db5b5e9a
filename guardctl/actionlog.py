"""The append-only action log: every action guardctl takes, with who, when, why and evidence.

One JSON object per line in ``<store>/actions/actions.jsonl``. An action is
written twice: an ``intent`` line before guardctl touches Slurm and an outcome
line (``done``, ``failed``, ``reconciled``, ``abandoned``) after, sharing one
``id``. An intent without an outcome is what a crash leaves behind; the next
command reconciles it against Slurm's state. Lines are appended under an
exclusive lock with one write and an fsync, so concurrent guardctl processes
never interleave or tear a line.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl.errors import StoreError
from guardctl.fileio import locked
from guardctl.layout import actions_log

OUTCOMES = frozenset({"done", "failed", "reconciled", "abandoned"})


def actor() -> str:
    """Who is acting: the invoking user (through sudo too) at this host."""
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Entry:
    """One line of the action log."""

    id: str
    ts: float
    action: str  # drain, resume, quarantine, release, or a free word (sweep-submit, ...)
    phase: str  # intent, done, failed, reconciled, abandoned, or "note" for one-line records
    nodes: tuple[str, ...]
    actor: str = ""
    host: str = ""
    pid: int = 0
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
                "id": self.id, "ts": self.ts, "action": self.action, "phase": self.phase,
                "nodes": list(self.nodes), "actor": self.actor, "host": self.host,
                "pid": self.pid, "reason": self.reason, "evidence": self.evidence,
        }  # fmt: skip

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, line: str) -> Entry | None:
        try:
            raw = json.loads(line)
            return cls(
                id=str(raw["id"]), ts=float(raw["ts"]), action=str(raw["action"]),
                phase=str(raw["phase"]), nodes=tuple(str(n) for n in raw["nodes"]),
                actor=str(raw.get("actor", "")), host=str(raw.get("host", "")),
                pid=int(raw.get("pid", 0)), reason=str(raw.get("reason", "")),
                evidence=dict(raw.get("evidence") or {}),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None


class ActionLog:
    """Append to and read the action log under a store root.

    *clock* stamps each entry: the wall clock, or a simulated cluster's clock (a fleet
    simulation over :class:`~guardctl.slurm.memory.MemorySlurm` passes its ``time``).
    """

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = actions_log(root)
        self.clock = clock

    def _ensure_dir(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.path.parent}: {exc.strerror}") from None

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's action lock: one acting guardctl at a time decides and acts."""
        self._ensure_dir()
        with locked(self.path.with_name("lock")):
            yield

    def append(self, entry: Entry) -> Entry:
        self._ensure_dir()
        data = (entry.to_json() + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot write the action log {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            written = os.write(fd, data)
            if written != len(data):
                raise StoreError(f"short write to {self.path}")
            os.fsync(fd)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreError(f"the store is full: cannot write {self.path}") from None
            raise StoreError(f"cannot write the action log {self.path}: {exc.strerror}") from None
        finally:
            os.close(fd)
        return entry

    def entries(self) -> list[Entry]:
        """Every well-formed entry, oldest first (a torn last line is ignored)."""
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot read the action log {self.path}: {exc.strerror}") from None
        lines = text.split("\n")
        out = []
        for line in lines[:-1]:  # the part after the last newline is not a complete line
            entry = Entry.from_json(line) if line.strip() else None
            if entry is not None:
                out.append(entry)
        return out

    def history(self, nodes: Sequence[str] | None = None, limit: int = 50) -> list[Entry]:
        """The newest *limit* entries, only those naming one of *nodes* if given."""
        wanted = set(nodes or ())
        entries = [e for e in self.entries() if not wanted or wanted & set(e.nodes)]
        return entries[-limit:]

    # -- writing helpers -----------------------------------------------------------------
    def record(
        self,
        action: str,
        phase: str,
        nodes: Sequence[str],
        *,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
        entry_id: str | None = None,
    ) -> Entry:
        return self.append(
            Entry(
                id=entry_id or uuid.uuid4().hex[:16],
                ts=self.clock(),
                action=action,
                phase=phase,
                nodes=tuple(nodes),
                actor=actor(),
                host=socket.gethostname(),
                pid=os.getpid(),
                reason=reason,
                evidence=dict(evidence or {}),
            )
        )


def pending_intents(entries: Sequence[Entry]) -> list[Entry]:
    """Intents that have no outcome line yet (a crash, or an action still in flight)."""
    closed = {e.id for e in entries if e.phase in OUTCOMES}
    return [e for e in entries if e.phase == "intent" and e.id not in closed]
