"""The store writer the agent and the probe share: append-only, never torn, survives outages.

Two layers:

- :class:`LineWriter` appends a batch of whole lines to one file with a single
  ``os.write`` on an ``O_APPEND`` descriptor, then ``fsync``. If the write comes
  back short or fails, the file is cut back to where the batch began; if the
  process was killed mid-write, the next writer cuts a partial last line off when
  it opens the file. Readers already skip a last line without a newline, so a
  reader never sees half a record as good data.
- :class:`BufferedStore` sits in front: while the store cannot be written
  (read-only, full, over quota, I/O errors) it keeps up to *capacity* lines in
  memory, oldest dropped first and counted, says so once on each transition,
  and writes the backlog first, in order, when the store comes back.

There is one writer per file (the store layout guarantees it), so no locking.
Telemetry writers give the :class:`LineWriter` a :class:`~guardctl.telemetry.mirror.Mirror`,
which keeps each file's column mirror in step after every durable batch.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from guardctl.storage import segments

if TYPE_CHECKING:
    from guardctl.telemetry.mirror import Mirror

WriteFn = Callable[[int, bytes], int]

# Bytes written per os.write (and fsync): bounds one syscall's size; a node's batch of a few
# seconds (a few hundred kB) is one write.
MAX_BYTES_PER_WRITE = 8 << 20
# A directory the writer makes (an agent's segment directory): every reader may list it.
DIRECTORY_MODE = 0o755
# How far back a partial last line is searched for on open.
_TAIL_SCAN = 1 << 20


def describe(exc: OSError) -> str:
    """``ENOSPC (No space left on device)``: the errno's name, for log lines."""
    name = errno.errorcode.get(exc.errno or 0, "error")
    return f"{name} ({exc.strerror or exc})"


class LineWriter:
    """Appends whole-line batches to files, one open descriptor per file."""

    def __init__(
        self,
        write: WriteFn = os.write,
        fsync: Callable[[int], None] = os.fsync,
        mirror: Mirror | None = None,
        guard: Callable[[], None] | None = None,
    ) -> None:
        # write and fsync are the seams tests use to inject ENOSPC, EROFS or EIO.
        self._write = write
        self._fsync = fsync
        self._fds: dict[Path, int] = {}
        # Telemetry writers keep each file's column mirror (guardctl.telemetry.mirror) in step.
        self.mirror = mirror
        # Raises OSError when nothing may be written now (the agent: the store is not mounted);
        # checked before every batch, before any directory is made.
        self.guard = guard

    def append(self, path: Path, data: bytes) -> None:
        """Append *data* (complete lines) to *path*, durably, or raise OSError."""
        if self.guard is not None:
            self.guard()
        fd = self._fds.get(path)
        if fd is None:
            fd = self._open(path)
        start = os.fstat(fd).st_size
        try:
            written = self._write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
            self._fsync(fd)
        except OSError:
            self._cut_back(path, fd, start)
            raise
        if self.mirror is not None:  # only once the lines are durable: it never leads them
            self.mirror.append(path, start, data)

    def _open(self, path: Path) -> int:
        _make_directory(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _drop_partial_tail(fd)
        except OSError:
            os.close(fd)
            raise
        # One file per time segment: a descriptor for an older segment is not needed again.
        series = segments.series(path)
        for old in [p for p in self._fds if p != path and segments.series(p) == series]:
            os.close(self._fds.pop(old))
            if self.mirror is not None:
                self.mirror.forget(old)
        self._fds[path] = fd
        return fd

    def _cut_back(self, path: Path, fd: int, size: int) -> None:
        # Leave the file as it was before this batch, and reopen it next time so
        # that a failed cut is repaired by _drop_partial_tail.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        self._fds.pop(path, None)
        os.close(fd)

    def close(self) -> None:
        """Close every open descriptor."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self.mirror is not None:
            self.mirror.close()


def _make_directory(directory: Path) -> None:
    """*directory*, made if missing with mode 0755 whatever the umask: an agent's segment
    directory is written by every node's agent and read by operators and the site's own
    engines (docs/telemetry.md, ownership and modes)."""
    if directory.is_dir():
        return
    try:
        directory.mkdir(parents=True)
    except FileExistsError:
        if directory.is_dir():  # another node's agent made it first
            return
        raise
    os.chmod(directory, DIRECTORY_MODE)


def _drop_partial_tail(fd: int) -> None:
    """Cut a last line without newline (a writer killed mid-write) off the file."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = max(0, size - _TAIL_SCAN)
    tail = os.pread(fd, size - start, start)
    cut = tail.rfind(b"\n")
    os.ftruncate(fd, start + cut + 1 if cut >= 0 else start)


@dataclass
class StoreState:
    """What the agent reports about the store in its status."""

    writable: bool = True
    error: str = ""
    since: float = 0.0
    written: int = 0
    buffered: int = 0
    dropped: int = 0


class BufferedStore:
    """Writes (path, line) items in order; buffers, bounded, while the store fails."""

    def __init__(
        self,
        capacity: int,
        log: logging.Logger,
        writer: LineWriter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.capacity = capacity
        self.log = log
        self.writer = writer or LineWriter()
        self.clock = clock
        self.pending: deque[tuple[Path, bytes]] = deque()
        self.state = StoreState(since=clock())
        self._dropped_at_outage = 0

    def write(self, items: Iterable[tuple[Path, str]]) -> bool:
        """Queue *items* and write everything queued; True if nothing is left pending."""
        for path, line in items:
            self.pending.append((path, line.encode() + b"\n"))
        overflow = len(self.pending) - self.capacity
        for _ in range(max(0, overflow)):
            self.pending.popleft()  # the oldest go first: fresh data matters more
        if overflow > 0:
            self.state.dropped += overflow
        self._drain()
        self.state.buffered = len(self.pending)
        return not self.pending

    def _drain(self) -> None:
        while self.pending:
            path, batch = self._next_batch()
            try:
                self.writer.append(path, b"".join(batch))
            except OSError as exc:
                self._went_down(path, exc)
                return
            for _ in batch:
                self.pending.popleft()
            self.state.written += len(batch)
        if not self.state.writable:
            self._came_back()

    def _next_batch(self) -> tuple[Path, list[bytes]]:
        # Consecutive items for the same file: one write, in order.
        path = self.pending[0][0]
        batch: list[bytes] = []
        size = 0
        for item_path, data in self.pending:
            if item_path != path or (batch and size + len(data) > MAX_BYTES_PER_WRITE):
                break
            batch.append(data)
            size += len(data)
        return path, batch

    def _went_down(self, path: Path, exc: OSError) -> None:
        if self.state.writable:
            self.log.warning(
                "store unwritable: %s: %s; buffering up to %d records in memory",
                path,
                describe(exc),
                self.capacity,
            )
            self.state.writable = False
            self.state.since = self.clock()
            self._dropped_at_outage = self.state.dropped
        self.state.error = f"{path}: {describe(exc)}"

    def _came_back(self) -> None:
        lost = self.state.dropped - self._dropped_at_outage
        self.log.warning(
            "store writable again after %.0f s; backlog written, %d records dropped meanwhile",
            self.clock() - self.state.since,
            lost,
        )
        self.state.writable = True
        self.state.error = ""
        self.state.since = self.clock()

    def close(self) -> None:
        """Close the files (pending lines, if any, are lost: the caller tried first)."""
        self.writer.close()
