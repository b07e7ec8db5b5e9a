"""The leader lease: only one controller acts at a time, on any host sharing the store.

The lease is a small JSON file, ``<store>/control/lease.json``: the holder's host, pid, a
token and when the lease expires. It is read and rewritten under an flock of a lock file
beside it, and written whole (tmp + rename), so a reader never sees half a lease. NFS does
not always honour flock between hosts, so the flock only narrows the race; what makes the
lease safe is its expiry: a holder renews it well before it runs out and stops acting if it
ever finds the lease taken, and a contender takes it only once it has expired (or its holder
is on this host and dead, which only this host can tell).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from guardctl.errors import RefusedError, StoreError
from guardctl.fileio import atomic_write, locked
from guardctl.runner import process_alive


class LeaseLost(RefusedError):
    """Another controller took the lease while this one was acting: it must stop."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lease, and until when."""

    host: str
    pid: int
    token: str
    expires: float
    since: float

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "token": self.token,
                "expires": self.expires, "since": self.since}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Holder:
        return cls(str(raw["host"]), int(raw["pid"]), str(raw["token"]),
                   float(raw["expires"]), float(raw.get("since", 0.0)))


def may_take(current: Holder | None, me: Holder, now: float,
             alive: Callable[[int], bool] = process_alive) -> bool:
    """Whether *me* may write the lease over *current* (a pure rule, tested by values)."""
    if current is None or current.token == me.token:
        return True
    if current.expires <= now:
        return True
    # Only this host can tell that its own process is gone; another host waits for expiry.
    return current.host == me.host and not alive(current.pid)


class Lease:
    """This process's claim on the controller's lease under a store root."""

    def __init__(self, root: Path, duration_s: float) -> None:
        self.path = root / "control" / "lease.json"
        self.duration_s = duration_s
        self.token = secrets.token_hex(8)
        self.since = time.time()

    def me(self, now: float) -> Holder:
        return Holder(socket.gethostname(), os.getpid(), self.token, now + self.duration_s,
                      self.since)

    def read(self) -> Holder | None:
        """The lease as it stands (None when nobody ever held it or the file is unreadable)."""
        try:
            return Holder.from_dict(json.loads(self.path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a torn or foreign file cannot hold the lease

    def acquire(self, now: float | None = None) -> tuple[bool, Holder | None]:
        """Take or renew the lease; returns (held by me now, the holder after the attempt)."""
        now = time.time() if now is None else now
        with self._locked():
            current = self.read()
            me = self.me(now)
            if not may_take(current, me, now):
                return False, current
            if current is None or current.token != self.token:
                self.since = now
                me = self.me(now)
            self._write(me)
            return True, me

    def release(self) -> None:
        """Give the lease up (only if it is still mine), so another controller need not wait."""
        with self._locked():
            current = self.read()
            if current is not None and current.token == self.token:
                self._write(Holder(current.host, current.pid, current.token, 0.0, current.since))

    def _write(self, holder: Holder) -> None:
        atomic_write(self.path, json.dumps(holder.as_dict()) + "\n")

    def _locked(self) -> AbstractContextManager[IO[str]]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.path.parent}: {exc.strerror}") from None
        return locked(self.path.with_name("lease.lock"))


