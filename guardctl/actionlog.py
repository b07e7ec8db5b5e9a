"""The append-only action log: every action guardctl takes, with who, when, why and evidence.

One JSON object per line in ``<store>/actions/actions.jsonl``. An action is
written twice: an ``intent`` line before guardctl touches Slurm and an outcome
line (``done``, ``failed``, ``reconciled``, ``abandoned``) after, sharing one
``id``. An intent without an outcome is what a crash leaves behind; the next
acting command reconciles it against Slurm's state. Each entry names its writer
(machine id, boot id, pid namespace, pid and start time: :class:`~guardctl.runner.Writer`).

Lines are appended under an exclusive lock with one write and an fsync, so concurrent guardctl
processes never interleave lines. A write that fails or comes up short (a full store) is taken
back (the file truncated to its size before it) and an append to a file that does not end with
a newline starts with one, so a fragment left anyway never swallows the next entry.

A reader keeps what it parsed and reads only the bytes appended since (a new file, after a
checkpoint, is read whole). :meth:`ActionLog.checkpoint` replaces a log grown too big by the
entries that still matter, atomically, and keeps the whole old file under ``archive/``.
"""

from __future__ import annotations

import contextlib
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
from typing import Any, BinaryIO

from guardctl.errors import StoreError
from guardctl.fileio import locked
from guardctl.runner import Writer, this_writer
from guardctl.storage.layout import actions_log

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
    writer: Writer = field(default_factory=Writer)  # unknown in entries from before it was kept

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts,
            "action": self.action,
            "phase": self.phase,
            "nodes": list(self.nodes),
            "actor": self.actor,
            "host": self.host,
            "pid": self.pid,
            "reason": self.reason,
            "evidence": self.evidence,
            "writer": self.writer.as_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, line: str) -> Entry | None:
        try:
            raw = json.loads(line)
            return cls(
                id=str(raw["id"]),
                ts=float(raw["ts"]),
                action=str(raw["action"]),
                phase=str(raw["phase"]),
                nodes=tuple(str(n) for n in raw["nodes"]),
                actor=str(raw.get("actor", "")),
                host=str(raw.get("host", "")),
                pid=int(raw.get("pid", 0)),
                reason=str(raw.get("reason", "")),
                evidence=dict(raw.get("evidence") or {}),
                writer=Writer.from_dict(raw.get("writer")),
            )
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
        # What this reader parsed so far: the file (device, inode), the bytes read (up to the
        # last newline) and the entries in them.
        self._file: tuple[int, int] | None = None
        self._offset = 0
        self._seen = b""  # the last bytes before the offset, to check the file against
        self._parsed: list[Entry] = []

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
        line = (entry.to_json() + "\n").encode()
        while True:
            fd = self._open_locked()
            try:
                if self._replaced(fd):  # a checkpoint replaced the file: append to the new one
                    continue
                self._write(fd, line)
                return entry
            finally:
                os.close(fd)

    def _open_locked(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot write the action log {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock the action log {self.path}: {exc.strerror}") from None
        return fd

    def _replaced(self, fd: int) -> bool:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return True
        held = os.fstat(fd)
        return (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino)

    def _write(self, fd: int, line: bytes) -> None:
        """One line at the end of the file, or nothing: a failed or short write is taken back."""
        size = os.fstat(fd).st_size
        data = line
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + line  # a fragment left by an earlier failure stays a line of its own
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreError(f"the store is full: cannot write {self.path}") from None
            raise StoreError(f"cannot write the action log {self.path}: {exc.strerror}") from None

    def entries(self) -> list[Entry]:
        """Every well-formed entry, oldest first (a torn last line is ignored).

        Only what was appended since this reader's last call is read and parsed.
        """
        try:
            with open(self.path, "rb") as f:
                if not self._still_read(f):  # another file, or not the bytes read before
                    st = os.fstat(f.fileno())
                    self._file, self._offset, self._seen, self._parsed = (
                        (st.st_dev, st.st_ino),
                        0,
                        b"",
                        [],
                    )
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            self._file, self._offset, self._seen, self._parsed = None, 0, b"", []
            return []
        except OSError as exc:
            raise StoreError(f"cannot read the action log {self.path}: {exc.strerror}") from None
        end = data.rfind(b"\n")  # what follows the last newline is not a complete line yet
        if end >= 0:
            text = data[:end].decode("utf-8", errors="replace")
            for line in text.split("\n"):
                entry = Entry.from_json(line) if line.strip() else None
                if entry is not None:
                    self._parsed.append(entry)
            self._offset += end + 1
            self._seen = (self._seen + data[: end + 1])[-64:]
        return list(self._parsed)

    def _still_read(self, f: BinaryIO) -> bool:
        """Whether *f* is the file this reader parsed, its bytes up to the offset unchanged (a
        write taken back and another in its place would leave the offset mid-line)."""
        st = os.fstat(f.fileno())
        if (st.st_dev, st.st_ino) != self._file or st.st_size < self._offset:
            return False
        f.seek(self._offset - len(self._seen))
        return f.read(len(self._seen)) == self._seen

    def size(self) -> int:
        """The log's size in bytes (0 when there is none yet)."""
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def checkpoint(self, keep: Callable[[list[Entry]], Sequence[Entry]]) -> Path | None:
        """Replace the log by the entries *keep* picks from it, oldest first; the whole old file
        stays as ``archive/actions-<UTC time>.jsonl``. Returns that archive.

        Call it under the action lock. Readers see the old file or the new one, never neither
        (the new file replaces the old by a rename); an append waiting on the old file finds it
        replaced and appends to the new one.
        """
        fd = self._open_locked()
        try:
            if self._replaced(fd):
                return None
            kept = keep(self.entries())
            archive = self._archive_name()
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                archive.parent.mkdir(exist_ok=True)
                with open(tmp, "wb") as out:
                    out.write(b"".join((e.to_json() + "\n").encode() for e in kept))
                    out.flush()
                    os.fsync(out.fileno())
                os.link(self.path, archive)
                os.replace(tmp, self.path)
                _sync_dir(self.path.parent)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise StoreError(
                    f"cannot checkpoint the action log {self.path}: {exc.strerror}"
                ) from None
            return archive
        finally:
            os.close(fd)

    def _archive_name(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        folder = self.path.with_name("archive")
        name, n = folder / f"actions-{stamp}.jsonl", 1
        while name.exists():
            n += 1
            name = folder / f"actions-{stamp}-{n}.jsonl"
        return name

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
                writer=this_writer(),
            )
        )


def _sync_dir(folder: Path) -> None:
    """Make a rename in *folder* durable (a directory that cannot be opened is left as is)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def pending_intents(entries: Sequence[Entry]) -> list[Entry]:
    """Intents that have no outcome line yet (a crash, or an action still in flight)."""
    closed = {e.id for e in entries if e.phase in OUTCOMES}
    return [e for e in entries if e.phase == "intent" and e.id not in closed]
