"""The one door to external programs: argument lists, timeouts, no shell.

Nothing else in guardctl imports :mod:`subprocess`. Every command runs in its
own session so that a timeout kills the whole process group (a hung ``srun``
leaves no orphans), and every failure keeps argv, return code, stdout and
stderr so the error message can say exactly what went wrong. :func:`as_user` is the one
place guardctl forks without a new program: to act on a user's file with that user's rights.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from guardctl.errors import GuardctlError, UsageError


@dataclass(frozen=True)
class Result:
    """What a finished command returned."""

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    duration_s: float


class CommandError(GuardctlError):
    """A command could not be run, failed or timed out."""

    def __init__(self, message: str, argv: Sequence[str], result: Result | None = None) -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        self.result = result


class CommandNotFound(CommandError):
    """The program does not exist or is not executable."""


class CommandFailed(CommandError):
    """The program exited non-zero (``check=True``)."""


class CommandTimeout(CommandError):
    """The program ran past its timeout; its process group was killed."""


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    # A str passed as argv would be split into characters; refuse it loudly.
    if isinstance(argv, str | bytes) or not argv:
        raise UsageError(f"internal: command must be a non-empty argument list, got {argv!r}")
    return tuple(str(a) for a in argv)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    cwd: str | None = None,
    check: bool = True,
) -> Result:
    """Run *argv* to completion and return its :class:`Result`.

    Raises :class:`CommandNotFound`, :class:`CommandTimeout`, and with
    ``check=True`` :class:`CommandFailed` on a non-zero exit.
    """
    args = _check_argv(argv)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise CommandNotFound(f"cannot run {args[0]}: {exc.strerror}", args) from exc
    try:
        out, err = proc.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        result = Result(args, -9, out, err, time.monotonic() - started)
        raise CommandTimeout(
            f"{' '.join(args)} did not finish within {timeout:g} s", args, result
        ) from None
    result = Result(args, proc.returncode, out, err, time.monotonic() - started)
    if check and proc.returncode != 0:
        detail = (err.strip() or out.strip()).splitlines()
        tail = detail[-1] if detail else "no output"
        raise CommandFailed(f"{' '.join(args)} exited {proc.returncode}: {tail}", args, result)
    return result


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdout_path: str | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start a long-running child in its own session (for services, agents and helpers).

    *pass_fds*: open files the child inherits (a socket, a memory file). The caller
    owns the process and must stop it with :func:`stop`.
    """
    args = _check_argv(argv)
    out = open(stdout_path, "ab") if stdout_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    except (FileNotFoundError, PermissionError) as exc:
        raise CommandNotFound(f"cannot run {args[0]}: {exc.strerror}", args) from exc
    finally:
        if stdout_path and not isinstance(out, int):
            out.close()


def stop(proc: subprocess.Popen[bytes], *, grace: float = 5.0) -> int:
    """Stop a spawned child: SIGTERM to its group, SIGKILL after *grace* seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


@dataclass(frozen=True)
class Writer:
    """Who wrote a record that names its writer (an action's intent, a sweep's reservation).

    A hostname and a pid do not identify a process: containers share hostnames and each has
    its own pid namespace, and a pid is reused after a reboot. The machine id, the boot id, the
    pid namespace and the process's start time (clock ticks since boot) do.
    """

    machine: str = ""  # /etc/machine-id
    boot: str = ""  # /proc/sys/kernel/random/boot_id
    pidns: int = 0  # inode of /proc/self/ns/pid
    pid: int = 0
    start: int = 0  # the process's start time in clock ticks since boot (/proc/PID/stat)

    def as_dict(self) -> dict[str, str | int]:
        return {
            "machine": self.machine,
            "boot": self.boot,
            "pidns": self.pidns,
            "pid": self.pid,
            "start": self.start,
        }

    @classmethod
    def from_dict(cls, raw: object) -> Writer:
        """A writer read back; anything missing or malformed reads as unknown."""
        if not isinstance(raw, dict):
            return cls()
        try:
            return cls(
                str(raw.get("machine") or ""),
                str(raw.get("boot") or ""),
                int(raw.get("pidns") or 0),
                int(raw.get("pid") or 0),
                int(raw.get("start") or 0),
            )
        except (TypeError, ValueError):
            return cls()


def _read_id(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int:
    """When *pid* started, in clock ticks since boot; 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def this_writer() -> Writer:
    """This process, as records that name their writer identify it."""
    return _writer_of(os.getpid())  # keyed by pid: a forked child is another writer


@functools.lru_cache(maxsize=4)
def _writer_of(pid: int) -> Writer:
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    return Writer(
        _read_id("/etc/machine-id"),
        _read_id("/proc/sys/kernel/random/boot_id"),
        pidns,
        pid,
        _start_ticks(pid),
    )


def writer_alive(writer: Writer) -> bool | None:
    """Whether *writer* still runs: True or False where this process can tell (the same machine,
    boot and pid namespace), None where it cannot (another machine or container, an identity it
    cannot read): the caller then judges by age."""
    me = this_writer()
    if not writer.machine or not writer.boot or not me.machine or not me.boot:
        return None
    if writer.machine != me.machine:
        return None
    if writer.boot != me.boot:
        # This machine rebooted since, or it is another one cloned from the same image (the
        # same machine id): only the caller's age rule tells those apart safely.
        return None
    if not writer.pidns or writer.pidns != me.pidns:
        return None
    if not process_alive(writer.pid):
        return False
    return not writer.start or _start_ticks(writer.pid) in (0, writer.start)


AS_USER_FAILED = 255  # as_user's child could not drop to the user, or its work raised


def as_user(
    uid: int, gid: int, groups: Sequence[int], work: Callable[[], int], *, timeout: float
) -> int:
    """Run *work* in a forked child that has given up root for *uid*, *gid* and *groups* for
    good; return its result (0-254), 255 when the child could not take that identity or *work*
    raised, or -1 when it ran past *timeout* and was killed.

    For touching a path a user chose (the job's stderr file): the kernel then checks the
    user's own permissions, so a symlink or a path of the user's cannot borrow root's. No
    program is started: the child only calls *work* and exits, and *work* must use nothing
    but system calls (a fork copies one thread; a lock another thread held stays held).
    """
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = AS_USER_FAILED
        try:
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            code = work()
        finally:
            os._exit(code & 0xFF)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:  # a hung filesystem: give up, never wait forever
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.01)


def process_alive(pid: int) -> bool:
    """Whether process *pid* of this host still runs; a zombie counts as gone, and a process
    that is there but not ours to signal counts as alive. For the lock and intent files that
    name their writer's pid (the controller's lease, an action's intent, a service's lock)."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
