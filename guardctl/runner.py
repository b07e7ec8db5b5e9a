"""The one door to external programs: argument lists, timeouts, no shell.

Nothing else in guardctl imports :mod:`subprocess`. Every command runs in its
own session so that a timeout kills the whole process group (a hung ``srun``
leaves no orphans), and every failure keeps argv, return code, stdout and
stderr so the error message can say exactly what went wrong.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
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
