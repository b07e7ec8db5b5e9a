"""How a training rank hands its step records to the node agent: a Unix socket on node-local disk.

The shared filesystem then has one writer per node (the agent), and ranks never write to it.

The wire is a stream of lines on an ``AF_UNIX`` stream socket (default
``/run/guardctl/agent.sock``)::

    rank  -> agent   <step record>\\n ... end <dropped> <store id>\\n
    agent -> rank    ok <accepted> <refused>\\n | busy\\n | store\\n

A batch is the probe's schema-v1 lines, as it would have written them, then ``end`` with the
number of steps the rank dropped so far (its queue was full) and the identity (``dev:inode``) of
the store directory the rank was told to use. The agent answers once it holds the batch in
memory: ``busy`` (its buffer is full: the rank keeps the batch and sends it again), ``store``
(the rank names another store than the agent's: the rank writes that one directly). Until the
answer comes the rank keeps the batch, so an agent that restarts loses none of it.

The agent trusts only what the kernel says about the sender (``SO_PEERCRED``: pid, uid, gid)
and ``/proc``: a step record must be of the agent's node and, for a sender that is not root, of
the Slurm job the sending process runs in (its cgroup ``job_<id>``, else the root-owned
``slurmstepd: [<id>.<step>]`` it descends from). A job name of the user's own choosing
(``GUARDCTL_JOB``, not a Slurm job id) belongs to the first user who sends it. Anything else is
refused and counted by reason; a client that breaks the protocol is dropped, counted.

This module is standard library only: the probe imports it inside training jobs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import selectors
import socket
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl.telemetry.schema import BadRecord, parse_line

ENV_SOCKET = "GUARDCTL_AGENT_SOCKET"
DEFAULT_SOCKET = "/run/guardctl/agent.sock"
# A batch's lines travel in pieces of at most this many lines (bounds the agent's memory per
# client, and the time one answer takes).
BATCH_LINES = 2000
MAX_LINE = 64 << 10
# A step's time must be within this of the agent's clock (the same node's): a record far off
# would open a file of another hour or year in the node's directory.
MAX_SKEW_S = 3600.0  # a step record is ~200 bytes: a longer line is not one
REPLY_TIMEOUT_S = 5.0
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_SLURMSTEPD = re.compile(rb"^slurmstepd: \[(\d+)\.")
_CGROUP_JOB = re.compile(r"/job_(\d+)(?:/|$)", re.MULTILINE)
_MAX_CLAIMS = 10_000


def socket_path(node: str, configured: str | None = None) -> str:
    """The socket's path: *configured*, else ``$GUARDCTL_AGENT_SOCKET``, else the default.

    ``{node}`` in it becomes the node's name (several agents on one host, one per node name).
    An empty path means no agent is to be used.
    """
    text = configured if configured is not None else os.environ.get(ENV_SOCKET, DEFAULT_SOCKET)
    return text.replace("{node}", node)


def store_id(root: Path) -> str:
    """``dev:inode`` of the store directory: the same store, whatever path a container gives it."""
    try:
        st = os.stat(root)
    except OSError:
        return "-"
    return f"{st.st_dev}:{st.st_ino}"


# -- the rank's side ----------------------------------------------------------------------------


class Refused(Exception):
    """The agent will not take this rank's records: it writes another store, or it refused
    every record of a batch (another node's agent, or not the sender's job). *taken*: how many
    lines it answered for before that (they are the agent's)."""

    taken: int = 0


class AgentLink:
    """A rank's connection to its node's agent; every call is from the probe's flush thread."""

    def __init__(self, path: str, timeout_s: float = REPLY_TIMEOUT_S) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None

    def present(self) -> bool:
        """Whether an agent's socket is there (running, or restarting: its file stays)."""
        try:
            return stat.S_ISSOCK(os.lstat(self.path).st_mode)
        except (OSError, ValueError):
            return False

    def send(self, lines: list[str], dropped: int, store: str) -> int:
        """Hand *lines* over, in pieces; how many the agent answered for (the first ones):
        the rest are the rank's to keep and send again.

        Raises :class:`Refused` when the agent writes another store than the rank's.
        """
        done = 0
        try:
            for start in range(0, max(1, len(lines)), BATCH_LINES):
                piece = lines[start : start + BATCH_LINES]
                if not self._exchange(piece, dropped, store):
                    break
                done += len(piece)
        except OSError:
            self.close()
        except Refused as exc:
            exc.taken = done
            raise
        return done

    def _exchange(self, lines: list[str], dropped: int, store: str) -> bool:
        sock = self._connected()
        body = "".join(f"{line}\n" for line in lines) + f"end {int(dropped)} {store}\n"
        sock.sendall(body.encode())
        answer = self._answer(sock)
        if answer.startswith("ok "):
            _, accepted, refused = [*answer.split(), "0", "0"][:3]
            if lines and accepted == "0" and refused == str(len(lines)):
                # Not one taken: the records are not this agent's to write (another node's
                # agent on a shared socket path, or another job's name); losing them silently
                # would hide the rank, so the rank writes them itself.
                raise Refused(f"the node agent at {self.path} refused all {refused} step records")
            return True
        if answer == "store":
            raise Refused(f"the node agent at {self.path} writes another store")
        if answer != "busy":
            raise OSError(errno.EPROTO, f"unexpected answer {answer[:40]!r}")
        return False

    def _connected(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def _answer(self, sock: socket.socket) -> str:
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(256)
            if not chunk or len(data) > 256:
                raise OSError(errno.ECONNRESET, "the agent closed the connection")
            data += chunk
        return data.decode(errors="replace").strip()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


# -- the agent's side ---------------------------------------------------------------------------


def slurm_job_of(pid: int, proc: str = "/proc") -> str | None:
    """The Slurm job process *pid* runs in, from what only root can set; None when in none.

    The cgroup Slurm put it in (``.../job_<id>/...``) where Slurm tracks jobs by cgroup, else the
    nearest ancestor that is a root-owned ``slurmstepd: [<id>.<step>]`` (proctrack/linuxproc).
    """
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            found = _CGROUP_JOB.search(f.read())
        if found:
            return found.group(1)
    except OSError:
        return None
    current = pid
    for _ in range(64):
        parent = _parent(proc, current)
        if parent is None:
            return None
        if _real_uid(proc, current) == 0 and _comm(proc, current) == "slurmstepd":
            with contextlib.suppress(OSError):
                with open(f"{proc}/{current}/cmdline", "rb") as f:
                    match = _SLURMSTEPD.match(f.read(256))
                if match:
                    return match.group(1).decode()
        if parent <= 1:
            return None
        current = parent
    return None


def _stat_fields(proc: str, pid: int) -> tuple[str, list[str]] | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm is in parentheses and may itself hold ") ": the last one ends it
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def _parent(proc: str, pid: int) -> int | None:
    fields = _stat_fields(proc, pid)
    if fields is None or len(fields[1]) < 2:
        return None
    try:
        return int(fields[1][1])
    except ValueError:
        return None


def _comm(proc: str, pid: int) -> str:
    fields = _stat_fields(proc, pid)
    return fields[0] if fields else ""


def _real_uid(proc: str, pid: int) -> int | None:
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class _Client:
    """One connected rank: who the kernel says it is, and its unfinished batch."""

    sock: socket.socket
    pid: int
    uid: int
    job: str | None  # the Slurm job it runs in, None when in none
    pending: bytearray = field(default_factory=bytearray)
    lines: list[bytes] = field(default_factory=list)


@dataclass
class InboxStats:
    """What the agent says about the hand-off in its status."""

    socket: str = ""
    listening: bool = False
    error: str = ""
    clients: int = 0
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    dropped_clients: Counter[str] = field(default_factory=Counter)
    # Steps each job's ranks on this node dropped themselves (queue full), as they last said.
    probe_dropped: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "socket": self.socket,
            "listening": self.listening,
            "error": self.error,
            "clients": self.clients,
            "accepted": self.accepted,
            "refused": dict(self.refused),
            "dropped_clients": dict(self.dropped_clients),
            "probe_dropped": dict(self.probe_dropped),
        }


class Inbox:
    """The agent's socket: receives step records from this node's ranks, checked, in memory.

    A thread of its own accepts and reads (never the sampling loop); :meth:`take` hands what
    arrived to the agent, which appends it with its own records at its cadence.
    """

    def __init__(
        self,
        path: str,
        node: str,
        store: Path,
        log: logging.Logger,
        *,
        capacity: int = 100_000,
        max_clients: int = 1024,
        job_of: Callable[[int], str | None] = slurm_job_of,
    ) -> None:
        self.path = path
        self.node = node
        self.store = store
        self.log = log
        self.capacity = capacity
        self.max_clients = max_clients
        self.job_of = job_of
        self.stats = InboxStats(socket=path)
        self._records: list[tuple[float, bytes]] = []
        self._lock = threading.Lock()
        self._claims: dict[str, int] = {}
        self._clients: dict[int, _Client] = {}
        self._selector: selectors.DefaultSelector | None = None
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store_id = ""
        self._inode = 0

    # -- life ---------------------------------------------------------------------------------

    def open(self) -> bool:
        """Listen on the socket and start the reading thread; False (and why, logged) if not."""
        try:
            self._listener = self._listen()
        except OSError as exc:
            self.stats.error = f"{self.path}: {exc.strerror or exc}"
            self.log.warning(
                "no hand-off socket for ranks (%s): ranks on this node write the store directly",
                self.stats.error,
            )
            return False
        self._store_id = store_id(self.store)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self.stats.listening = True
        self._thread = threading.Thread(target=self._serve, name="guardctl-inbox", daemon=True)
        self._thread.start()
        self.log.info("ranks hand their step records over at %s", self.path)
        return True

    def _listen(self) -> socket.socket:
        directory = os.path.dirname(self.path) or "."
        with contextlib.suppress(FileExistsError):
            os.makedirs(directory, mode=0o755)
        _check_private_dir(directory)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):
                raise OSError(errno.EEXIST, "exists and is not a socket: left alone")
            if _answers(self.path):
                raise OSError(errno.EADDRINUSE, "another agent listens there")
            os.unlink(self.path)  # the socket of an earlier run of this agent
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self.path)
            self._inode = os.lstat(self.path).st_ino
            # Any local user's ranks connect; the kernel tells who each one is.
            os.chmod(self.path, 0o666)
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        """Stop reading, close every connection and remove the socket (ranks keep their steps)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for client in list(self._clients.values()):
            self._forget(client)
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(OSError):
                if os.lstat(self.path).st_ino == self._inode:  # still ours, not a successor's
                    os.unlink(self.path)
            self._listener = None
        if self._selector is not None:
            self._selector.close()
        self.stats.listening = False

    def take(self) -> list[tuple[float, bytes]]:
        """The step lines received since the last call (time, line with its newline), in order."""
        with self._lock:
            records, self._records = self._records, []
        return records

    # -- the reading thread -------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._selector is not None
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                try:
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fd in self._clients:  # (not one dropped earlier in this round)
                        self._read(self._clients[key.fd])
                except Exception as exc:  # a client must never take the agent down
                    client = self._clients.get(key.fd)
                    if client is not None:
                        self._drop(client, "error")
                    self.log.warning("hand-off: %s: %s", type(exc).__name__, exc)

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid, uid, _gid = _PEERCRED.unpack(creds)
        theirs = sum(1 for c in self._clients.values() if c.uid == uid)
        if len(self._clients) >= self.max_clients or theirs >= self.max_clients // 4:
            sock.close()  # one user cannot take every connection from the others
            self.stats.dropped_clients["too many connections"] += 1
            return
        sock.setblocking(False)
        client = _Client(sock, pid, uid, None if uid == 0 else self.job_of(pid))
        self._clients[sock.fileno()] = client
        self._selector.register(sock, selectors.EVENT_READ)
        self.stats.clients = len(self._clients)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(256 << 10)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._forget(client)  # the rank went away (its unanswered batch is still its own)
            return
        client.pending += data
        while True:
            cut = client.pending.find(b"\n")
            if cut < 0:
                break
            line = bytes(client.pending[: cut + 1])
            del client.pending[: cut + 1]
            if not self._line(client, line):
                return
        if len(client.pending) > MAX_LINE:
            self._drop(client, "line too long")

    def _line(self, client: _Client, line: bytes) -> bool:
        if line.startswith(b"end "):
            return self._end(client, line)
        if len(client.lines) >= BATCH_LINES:
            self._drop(client, "batch too long")
            return False
        client.lines.append(line)
        return True

    def _end(self, client: _Client, line: bytes) -> bool:
        parts = line.split()
        if len(parts) != 3 or not parts[1].isdigit():
            self._drop(client, "bad end of batch")
            return False
        batch, client.lines = client.lines, []
        if parts[2].decode(errors="replace") != self._store_id:
            self.stats.refused["another store"] += len(batch)
            return self._reply(client, b"store\n")
        with self._lock:
            if len(self._records) + len(batch) > self.capacity:
                return self._reply(client, b"busy\n")  # the rank keeps them and tries again
        good: list[tuple[float, bytes]] = []
        jobs: set[str] = set()
        for raw in batch:
            why, record = self._check(client, raw)
            if why:
                self.stats.refused[why] += 1
            else:
                good.append((float(record["ts"]), raw))
                jobs.add(record["job"])
        with self._lock:
            self._records.extend(good)
        self.stats.accepted += len(good)
        for job in jobs:
            self.stats.probe_dropped[job] = int(parts[1])
        return self._reply(client, f"ok {len(good)} {len(batch) - len(good)}\n".encode())

    def _check(self, client: _Client, raw: bytes) -> tuple[str, dict[str, Any]]:
        """Why this line is refused ("" when it is a step record this client may send)."""
        try:
            record = parse_line(raw)
        except BadRecord:
            return "not a record", {}
        if record["kind"] != "step":
            return "not a step record", record
        if record["node"] != self.node:
            return "another node", record
        if abs(float(record["ts"]) - time.time()) > MAX_SKEW_S:
            return "time far from now", record
        if not self._may_write(client, record["job"]):
            return "another job", record
        return "", record

    def _may_write(self, client: _Client, job: str) -> bool:
        if client.uid == 0:
            return True  # root can write the store itself
        if job == client.job:
            return True
        if job.isdecimal():
            return False  # a Slurm job id: only that job's own processes send it
        # A name of the job's own choosing: the first user who sends it keeps it.
        owner = self._claims.get(job)
        if owner is None:
            if len(self._claims) >= _MAX_CLAIMS:
                return False
            self._claims[job] = owner = client.uid
        return owner == client.uid

    def _reply(self, client: _Client, answer: bytes) -> bool:
        try:
            sent = client.sock.send(answer)
        except OSError:
            sent = 0
        if sent != len(answer):  # a client that does not read its answers
            self._drop(client, "not reading answers")
            return False
        return True

    def _drop(self, client: _Client, why: str) -> None:
        self.stats.dropped_clients[why] += 1
        self.log.warning(
            "hand-off: dropped a client (pid %d, uid %d): %s", client.pid, client.uid, why
        )
        self._forget(client)

    def _forget(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if fd >= 0 and self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(client.sock)
        self._clients.pop(fd, None)
        client.sock.close()
        self.stats.clients = len(self._clients)


def _answers(path: str) -> bool:
    """Whether a process listens on the socket at *path*."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def _check_private_dir(directory: str) -> None:
    """The socket's directory must be a real directory of this user that nobody else can write.

    Otherwise another user could put a symlink or a socket of their own where ranks connect.
    """
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{directory} is not a directory (a symlink?): not used")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(
            errno.EPERM,
            f"{directory} must belong to the agent's user and be writable by nobody else",
        )
