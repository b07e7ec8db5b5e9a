"""The analyzer's reading helper: the per-file system calls of a pass, on another core.

At 100k GPUs a pass a minute looks at some 97,000 files: a ``stat`` of each
JSON Lines file, then a read of its column mirror's new rows. The calls are
short and a Python loop around them runs one at a time (threads only queue for
the interpreter lock), so they are a good part of a pass. The analyzer hands
them, a group of files at a time, to one helper process (``python -m
guardctl.tails``), which reads each mirror's new rows into memory both map (a
memory file), while the analyzer decodes the group before (two such buffers,
used in turn).

The helper only reads. It reports, per file, what ``stat`` said and how many
rows it read; every decision (a file replaced, cut short, a mirror rewritten,
what a cold pass would parse instead) stays the analyzer's. A group that does
not fit the buffer stops at the first file that does not: the analyzer reads
that file and the rest of the group itself, in order, so the records come in
the order they would without the helper.

Nothing here imports more than the standard library and
:mod:`guardctl.telemetry.mirror` (no numpy): the helper starts in a fraction of
a second and stays small. It exits when the analyzer closes its end of the
socket, or dies.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import resource
import socket
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from guardctl import runner
from guardctl.telemetry import mirror

# What the helper found, per file.
VANISHED = 0  # stat failed: deleted since it was listed
SAME = 1  # no bytes past what was read
READ = 2  # its mirror's rows read (perhaps none)
NO_MIRROR = 3  # its mirror cannot be opened or read, or is not a mirror of this file

# Room for one group's rows in each of the two buffers. Memory files are backed page by
# page as they are written, and a steady pass's group needs a few MiB of it.
ROOM = 64 << 20


# One file of a group: its number (:meth:`Helper.file_id`), the JSON Lines bytes already
# read, where its mirror's new rows start (-1: the whole mirror, behind its preamble), and
# the room to leave in front of them (for its string rows, which the analyzer puts there).
# Plain numbers: a pass sends some 97,000 of them, and a group's message fits the socket's
# buffer (the analyzer does not wait for the helper to take it).
Item = tuple[int, int, int, int]

# A file's result: (status, size, inode, rows read).
Found = tuple[int, int, int, int]


class HelperGone(Exception):
    """The helper process is gone: it died, or its socket broke."""


class Helper:
    """The analyzer's end: starts the helper, sends it groups, hands back its results."""

    def __init__(self, room: int = 0) -> None:
        """*room*: bytes in each buffer (0: ``ROOM``)."""
        self.room = room or ROOM
        self.buffers = [_Buffer(self.room), _Buffer(self.room)]
        ours, theirs = socket.socketpair()
        self._ids: dict[str, int] = {}  # mirror path -> the file's number, both sides
        self._next_id = 0
        self._new: list[tuple[int, str, str]] = []  # numbered since the last group
        self._closes: list[int] = []
        self._drops: list[int] = []
        self._waiting: list[int] = []  # buffers of the groups sent and not yet collected
        try:
            package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            path = os.environ.get("PYTHONPATH")
            env = dict(os.environ, PYTHONPATH=package + (os.pathsep + path if path else ""))
            fds = [theirs.fileno(), *(b.fd for b in self.buffers)]
            self.proc = runner.spawn(
                [sys.executable, "-m", "guardctl.tails", *map(str, fds)],
                env=env,
                cwd=package,
                pass_fds=fds,
            )
        except BaseException:
            ours.close()
            for b in self.buffers:
                b.close()
            raise
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())

    def file_id(self, jsonl: str, cols: str) -> int:
        """The number the helper knows JSON Lines file *jsonl* (mirror *cols*) by."""
        found = self._ids.get(cols)
        if found is None:
            found = self._ids[cols] = self._next_id
            self._next_id += 1
            self._new.append((found, jsonl, cols))
        return found

    def send(self, buffer: int, items: Sequence[Item]) -> None:
        """Ask for *items* to be read into buffer *buffer* (0 or 1); mirrors closed or files
        dropped since the last group are let go of first."""
        self._send(("read", buffer, items, self._new, self._closes, self._drops))
        self._new, self._closes, self._drops = [], [], []
        self._waiting.append(buffer)

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self._conn.send(message)
        except OSError as exc:
            raise HelperGone(str(exc)) from exc

    def collect(self) -> tuple[int, list[Found]]:
        """The oldest group sent: its buffer and a result for each of its files up to the
        first that did not fit (the rest are the analyzer's to read)."""
        buffer = self._waiting.pop(0)
        try:
            found: list[Found] = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise HelperGone(str(exc) or "it exited") from exc
        return buffer, found

    def drain(self) -> None:
        """Collect what is still on its way (a pass that stopped half way)."""
        while self._waiting:
            self.collect()

    def close_file(self, cols: str) -> None:
        """Close the helper's copy of mirror *cols*, if it keeps one open, before the next group."""
        found = self._ids.get(cols)
        if found is not None:
            self._closes.append(found)

    def drop(self, cols: str) -> None:
        """Forget mirror *cols* and its file (no longer read)."""
        found = self._ids.pop(cols, None)
        if found is not None:
            self._drops.append(found)

    def reset(self) -> None:
        """Forget every file (the analyzer starts its state over): close every mirror kept open."""
        self._ids, self._new, self._closes, self._drops = {}, [], [], []
        self._send(("reset",))

    def let_go(self, used: int) -> None:
        """Give back the buffers' pages past their first *used* bytes (a first pass's groups
        fill them; a pass a minute later needs a few MiB)."""
        start = -(-used // mmap.PAGESIZE) * mmap.PAGESIZE
        if start < self.room:
            for b in self.buffers:
                with contextlib.suppress(OSError):  # (only memory kept a little longer)
                    b.map.madvise(mmap.MADV_REMOVE, start, self.room - start)

    def close(self) -> None:
        """Stop the helper and let go of the buffers."""
        with contextlib.suppress(OSError):
            self._conn.close()
        runner.stop(self.proc, grace=2.0)
        for b in self.buffers:
            b.close()


class _Buffer:
    """A memory file mapped here and in the helper (the helper maps it from its own fd)."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("guardctl-tails", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
            self.map.close()
        os.close(self.fd)


# --- the helper's side ---------------------------------------------------------------------


class _Reader:
    """Stats files and reads their mirrors' new rows, keeping mirrors open while there is room."""

    def __init__(self, buffers: Sequence[int]) -> None:
        self.views = [memoryview(mmap.mmap(fd, 0)) for fd in buffers]
        self.head = memoryview(bytearray(mirror.PREAMBLE_SIZE))
        self.paths: dict[int, tuple[str, str]] = {}  # number -> JSON Lines path, mirror path
        self.open: dict[int, int] = {}  # number -> its mirror, open
        # It opens nothing else: all of the open-files limit but a few, raised to the most
        # it may be (a daemon's unit raises both; see contrib/).
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        self.room = max(soft - 32, 0)

    def close(self, numbers: Sequence[int]) -> None:
        for number in numbers:
            fd = self.open.pop(number, -1)
            if fd >= 0:
                os.close(fd)

    def drop(self, numbers: Sequence[int]) -> None:
        self.close(numbers)
        for number in numbers:
            self.paths.pop(number, None)

    def reset(self) -> None:
        self.drop(list(self.paths))

    def group(self, buffer: int, items: Sequence[Item]) -> list[Found]:
        view = self.views[buffer]
        found: list[Found] = []
        end = 0
        for number, offset, at, prefix in items:
            jsonl, cols = self.paths[number]
            try:
                st = os.stat(jsonl)
            except OSError:
                found.append((VANISHED, 0, 0, 0))
                continue
            if st.st_size <= offset:
                found.append((SAME, st.st_size, st.st_ino, 0))
                continue
            start = end + prefix
            if start + mirror.WIDTH >= len(view):
                break  # no room: the analyzer reads it and the rest
            got = self._read(number, cols, view[start:], at, st.st_ino)
            if got is None:
                found.append((NO_MIRROR, st.st_size, st.st_ino, 0))
                continue
            if got >= len(view) - start:
                break  # it filled the room and may hold more
            rows = got // mirror.WIDTH
            found.append((READ, st.st_size, st.st_ino, rows))
            end = start + rows * mirror.WIDTH
        return found

    def _read(self, number: int, cols: str, into: memoryview, at: int, ino: int) -> int | None:
        """Bytes read from mirror *cols* into *into* (from byte *at*, or behind the preamble
        when *at* is -1); None: no mirror of this file there."""
        fd = self.open.get(number, -1)
        kept = fd >= 0
        if not kept:
            try:
                fd = os.open(cols, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            if len(self.open) < self.room:
                self.open[number] = fd
                kept = True
        got: int | None = None
        try:
            if at >= 0:
                got = os.preadv(fd, [into], at)
            else:
                n = os.preadv(fd, [self.head, into], 0)
                if n >= mirror.PREAMBLE_SIZE and mirror.check_preamble(self.head, ino):
                    got = n - mirror.PREAMBLE_SIZE
        except OSError:
            got = None
        if got is None or not kept:
            if kept:
                del self.open[number]
            os.close(fd)
        return got


def _receive(conn: Connection, inbox: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
    """Take the analyzer's messages as they come, then None once its end is closed."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):  # the analyzer closed its end, or is gone
        inbox.put(None)


def main(argv: Sequence[str]) -> int:
    """``python -m guardctl.tails SOCKET BUFFER BUFFER``: serve the analyzer on the socket."""
    sock, *buffers = (int(a) for a in argv)
    reader = _Reader(buffers)
    conn = Connection(sock)
    # Messages are taken in a thread of their own: the analyzer sends the next group while
    # this one's results are on their way, and when both are larger than the socket's
    # buffer, each side would wait for the other to read.
    inbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(conn, inbox), daemon=True).start()
    while (message := inbox.get()) is not None:
        if message[0] == "reset":
            reader.reset()
            continue
        _, buffer, items, new, closes, drops = message
        reader.paths.update((number, (jsonl, cols)) for number, jsonl, cols in new)
        reader.close(closes)
        reader.drop(drops)
        try:
            conn.send(reader.group(buffer, items))
        except OSError:  # the analyzer is gone
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
