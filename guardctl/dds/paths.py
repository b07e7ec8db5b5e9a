"""Where one job's data-sharding service keeps its secret, address and state.

The job's dds directory (``layout.dds_dir``) is created mode 0700 and the
secret file mode 0600, so only the job's user can talk to its service. The
address is replaced atomically (tmp + rename) so a rank never reads half of it.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from guardctl.config import Settings
from guardctl.errors import RefusedError, StoreError, UsageError
from guardctl.fileio import atomic_write, open_locked
from guardctl.runner import process_alive
from guardctl.storage import layout

LOCK_WAIT_S = 5.0  # how long a restart waits for a dead service's commit process
LOCK_FILE = "service.lock"
SECRET_FILE = "secret"
ADDRESS_FILE = "address.json"
STATE_FILE = "state.sqlite"
LOG_FILE = "service.log"


@dataclass(frozen=True)
class JobPaths:
    """The files of one job's service."""

    job: str
    dir: Path
    state_dir: Path

    @property
    def secret(self) -> Path:
        return self.dir / SECRET_FILE

    @property
    def address(self) -> Path:
        return self.dir / ADDRESS_FILE

    @property
    def log(self) -> Path:
        return self.dir / LOG_FILE

    @property
    def state(self) -> Path:
        return self.state_dir / STATE_FILE


def job_paths(settings: Settings, job: str) -> JobPaths:
    """The paths of *job*'s service under the configured store (and state_dir, if set)."""
    try:
        directory = layout.dds_dir(settings.store.root, job)
        if settings.dds.state_dir:
            state_dir = layout.dds_dir(Path(settings.dds.state_dir), job)
        else:
            state_dir = directory
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return JobPaths(job=job, dir=directory, state_dir=state_dir)


def _private_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o700)
    except OSError as exc:
        raise StoreError(f"cannot create {path}: {exc.strerror}") from exc


def prepare(paths: JobPaths) -> str:
    """Create the job's private directories; return its secret (made once, kept on restart)."""
    _private_dir(paths.dir)
    _private_dir(paths.state_dir)
    try:
        fd = os.open(paths.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(paths.secret)
    except OSError as exc:
        raise StoreError(f"cannot create {paths.secret}: {exc.strerror}") from exc
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(token + "\n")
        out.flush()
        os.fsync(out.fileno())
    return token


def lock_service(paths: JobPaths) -> IO[str]:
    """Hold the job's service lock: two services on one database would both hand out shards.

    The kernel drops the lock when the holder dies (even by SIGKILL), so a
    restart never finds a stale one. The service's commit process shares the
    lock and dies with it a moment later: while the recorded holder is dead,
    wait for that (a few seconds at most) rather than refuse.
    """
    path = paths.state_dir / LOCK_FILE
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            handle = open_locked(path, blocking=False)  # held for the service's life
            break
        except BlockingIOError:
            holder = _read_holder(path)
            if _holder_alive(holder) or time.monotonic() > deadline:
                raise RefusedError(
                    f"a service for job {paths.job} is already running ({holder})"
                ) from None
            time.sleep(0.05)
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def _read_holder(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii").strip() or "another process"
    except (OSError, UnicodeDecodeError):
        return "another process"


def _holder_alive(holder: str) -> bool:
    """Whether the service recorded in the lock file ("pid N") still runs (unknown: yes)."""
    word, _, number = holder.partition(" ")
    if word != "pid" or not number.isdigit():
        return True
    return process_alive(int(number))


def read_secret(path: Path) -> str:
    try:
        token = path.read_text(encoding="ascii").strip()
    except OSError as exc:
        raise StoreError(f"cannot read the job's secret {path}: {exc.strerror}") from exc
    if not token:
        raise StoreError(f"the job's secret {path} is empty")
    return token


def publish_address(paths: JobPaths, host: str, port: int) -> None:
    """Tell the job's ranks where the service listens (atomic replace)."""
    record = {"host": host, "port": port, "pid": os.getpid(), "started": time.time()}
    atomic_write(paths.address, json.dumps(record) + "\n")


def read_address(path: Path) -> tuple[str, int] | None:
    """The published ``(host, port)``, or None while there is none (yet)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return str(record["host"]), int(record["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
