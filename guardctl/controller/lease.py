"""The leader lease: only one controller acts at a time, on any host sharing the store.

The lease is a small JSON file, ``<store>/control/lease.json``: the holder's host, pid and
identity (:class:`~guardctl.runner.Writer`), a token naming its tenure and a renewal counter.
It is read and rewritten under an flock of a lock file beside it, and written whole (tmp +
rename), so a reader never sees half a lease.

No wall clock decides who leads: hosts' wall clocks may be minutes apart. Each process judges
time on its own monotonic clock (:class:`guardctl.clock.Clock`):

* The holder renews by bumping the counter, and counts its lease as good for ``lease_s`` (less
  a margin) from the moment it *began* that renewal. Past that, on its own clock, it holds
  nothing, even if nobody took the lease yet: a process that was paused (SIGSTOP, a VM
  migration, a hung NFS read) notices it slept past its lease.
* A contender watches the (token, counter) it reads, and takes the lease once it has seen the
  same value for ``lease_s`` of its own clock: no renewal in that long means the holder's own
  clock has run its lease out too. A contender that has never seen the lease waits a whole
  ``lease_s``. What a host saw is kept in ``control/watch.<boot>.json``, so that one-off passes
  (``--once`` from a timer) on one host add up their watching.
* A lease that cannot be read (ESTALE, EIO) or is garbled is **held**: nobody takes it, and the
  reason is given in one line. A released lease (its holder stopped) is free at once; so is one
  whose holder is a process of this very machine, boot and pid namespace that is gone.

:meth:`Lease.check` is the fence: called right before every change to Slurm and every write to
the action log (under the store's action lock, :mod:`guardctl.controller.fence`), it raises
:class:`LeaseLost` once the lease is not this process's any more, by the file or by its clock.
Taking the lease over from another holder happens under that same action lock, so a holder's
check and its change to Slurm are never split by a takeover where the flock is honoured.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from guardctl.clock import Clock
from guardctl.errors import RefusedError, StoreError
from guardctl.fileio import atomic_write, locked
from guardctl.runner import Writer, this_writer, writer_alive

# The holder acts only within this share of lease_s after it began its last renewal: a margin
# for the two hosts' monotonic clocks running at slightly different rates.
VALID_SHARE = 0.9


class LeaseLost(RefusedError):
    """This controller does not hold the lease any more (taken, run out, or unreadable): it
    must stop acting at once."""


class LeaseUnreadable(StoreError):
    """The lease file exists but cannot be read or parsed: it counts as held by someone."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lease: its tenure's token and how many times it renewed it."""

    host: str
    pid: int
    token: str
    renewals: int = 0
    lease_s: float = 0.0
    since: float = 0.0  # the holder's wall clock when its tenure began (for people)
    expires: float = 0.0  # the holder's wall clock + lease_s at its last renewal (for people)
    released: bool = False
    writer: Writer = field(default_factory=Writer)

    @property
    def version(self) -> tuple[str, int, float, bool]:
        """What changes at every renewal (an older holder changed only ``expires``)."""
        return (self.token, self.renewals, self.expires, self.released)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "token": self.token,
            "renewals": self.renewals,
            "lease_s": self.lease_s,
            "since": self.since,
            "expires": self.expires,
            "released": self.released,
            "writer": self.writer.as_dict(),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Holder:
        released = bool(raw.get("released", False)) or float(raw["expires"]) == 0.0
        return cls(
            str(raw["host"]),
            int(raw["pid"]),
            str(raw["token"]),
            int(raw.get("renewals", 0)),
            float(raw.get("lease_s", 0.0)),
            float(raw.get("since", 0.0)),
            float(raw["expires"]),
            released,
            Writer.from_dict(raw.get("writer")),
        )


def may_take(current: Holder | None, unrenewed_s: float, lease_s: float, gone: bool) -> bool:
    """Whether a contender may take the lease from *current* (a pure rule, tested by values):
    nobody ever held it, its holder released it, the contender has seen no renewal for
    *lease_s* of its own clock, or its holder is a process of this machine that is *gone*."""
    if current is None or current.released:
        return True
    return unrenewed_s >= lease_s or gone


class Lease:
    """This process's claim on the controller's lease under a store root.

    *action_lock* is the store's action lock (a takeover holds it); *clock* is this host's
    clocks (a test passes a skewed or paused one).
    """

    def __init__(
        self,
        root: Path,
        duration_s: float,
        *,
        action_lock: Callable[[], AbstractContextManager[Any]] = nullcontext,
        clock: Clock | None = None,
    ) -> None:
        self.path = root / "control" / "lease.json"
        self.duration_s = duration_s
        self.action_lock = action_lock
        self.clock = clock or Clock()
        self.token = ""  # this tenure's token ("" until this process first took the lease)
        self.renewals = 0
        self.valid_until = float("-inf")  # on self.clock.mono()
        self.why = ""  # why the last attempt did not hold the lease (one line)
        self._seen: tuple[tuple[str, int, float, bool], float] | None = None

    # -- reading -------------------------------------------------------------------------
    def read(self) -> Holder | None:
        """The lease as it stands (None when nobody ever held it); LeaseUnreadable when the
        file is there but cannot be read or makes no sense (fail closed: held)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LeaseUnreadable(
                f"cannot read the lease {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            raw = json.loads(text)
            return Holder.from_dict(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise LeaseUnreadable(f"the lease {self.path} is garbled") from None

    def holds(self) -> bool:
        """Whether this process holds the lease now (the fence, without raising)."""
        try:
            self.check()
        except (LeaseLost, StoreError):
            return False
        return True

    # -- the fence -----------------------------------------------------------------------
    def check(self) -> None:
        """Raise LeaseLost unless this process still holds the lease, by the file and by its
        own monotonic clock. A process that never took the lease is not a controller yet."""
        if not self.token:
            return
        left = self.valid_until - self.clock.mono()
        if left <= 0:
            raise LeaseLost(
                f"this controller's lease ran out by its own clock {-left:.0f} s "
                "ago (it was paused or blocked): not acting"
            )
        try:
            current = self.read()
        except LeaseUnreadable as exc:
            raise LeaseLost(f"{exc}: not acting") from None
        if current is None or current.version[:2] != (self.token, self.renewals):
            raise LeaseLost(f"lost the controller lease to {who(current)}: not acting")
        renew_due = left < self.duration_s * VALID_SHARE * 2 / 3  # a third of it used
        tenure = self.token
        if renew_due and not (self.acquire()[0] and self.token == tenure):
            raise LeaseLost(f"{self.why or 'the lease was taken anew'}: not acting")
        if self.valid_until <= self.clock.mono():  # the read itself may have hung
            raise LeaseLost(
                "this controller's lease ran out by its own clock while it read "
                "the lease: not acting"
            )

    # -- taking and renewing -------------------------------------------------------------
    def acquire(self) -> tuple[bool, Holder | None]:
        """Take or renew the lease; returns (held by me now, the holder after the attempt).
        When not held, :attr:`why` says why in one line."""
        with self.action_lock(), self._locked():
            started = self.clock.mono()
            try:
                current = self.read()
            except LeaseUnreadable as exc:
                self.why = f"{exc}: taken as held, not acting"
                return False, None
            if self._renewable(current, started):
                return True, self._write_mine(current, started, renew=True)
            unrenewed = self._watch(current, started)
            gone = current is not None and writer_alive(current.writer) is False
            if not may_take(current, unrenewed, self.duration_s, gone):
                assert current is not None
                self.why = (
                    f"another controller leads ({who(current)}; no renewal seen for "
                    f"{unrenewed:.0f} s of lease_s {self.duration_s:g} s): observing, "
                    "not acting"
                )
                return False, current
            return True, self._write_mine(current, started, renew=False)

    def _renewable(self, current: Holder | None, now: float) -> bool:
        """Mine, as I last wrote it, and not run out by my clock."""
        return (
            current is not None
            and bool(self.token)
            and not current.released
            and current.version[:2] == (self.token, self.renewals)
            and now < self.valid_until
        )

    def _watch(self, current: Holder | None, now: float) -> float:
        """How long this host has seen *current* unrenewed, on its monotonic clock."""
        if current is None:
            return 0.0
        if self._seen is None or self._seen[0] != current.version:
            self._seen = (current.version, now)
        kept = self._kept_watch()
        if kept is not None and kept[0] == current.version and kept[1] < self._seen[1]:
            self._seen = (current.version, kept[1])
        elif kept is None or kept[0] != current.version:
            self._keep_watch(current.version, self._seen[1])
        return now - self._seen[1]

    def _write_mine(self, current: Holder | None, started: float, *, renew: bool) -> Holder:
        if not renew:  # a new tenure: a new token, so that the last one's fence fails
            self.token, self.renewals = secrets.token_hex(8), 0
            since = self.clock.wall()
        else:
            assert current is not None
            self.renewals += 1
            since = current.since
        me = Holder(
            socket.gethostname(),
            os.getpid(),
            self.token,
            self.renewals,
            self.duration_s,
            since,
            self.clock.wall() + self.duration_s,
            False,
            this_writer(),
        )
        self._write(me)
        self.valid_until = started + self.duration_s * VALID_SHARE
        self.why = ""
        self._seen = (me.version, started)  # run out by my clock, I wait as a contender would
        return me

    def release(self) -> None:
        """Give the lease up (only if it is still mine), so another controller need not wait."""
        if not self.token:
            return
        with self._locked():
            try:
                current = self.read()
            except LeaseUnreadable:
                return
            if current is not None and current.version[:2] == (self.token, self.renewals):
                self._write(
                    Holder(
                        current.host,
                        current.pid,
                        current.token,
                        current.renewals,
                        current.lease_s,
                        current.since,
                        0.0,
                        True,
                        current.writer,
                    )
                )
        self.valid_until = float("-inf")

    # -- files ---------------------------------------------------------------------------
    def _write(self, holder: Holder) -> None:
        atomic_write(self.path, json.dumps(holder.as_dict()) + "\n")

    def _watch_file(self) -> Path:
        return self.path.with_name(f"watch.{self.clock.boot}.json")

    def _kept_watch(self) -> tuple[tuple[str, int, float, bool], float] | None:
        try:
            raw = json.loads(self._watch_file().read_text(encoding="utf-8"))
            token, renewals, expires, released = raw["version"]
            return (str(token), int(renewals), float(expires), bool(released)), float(raw["seen"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _keep_watch(self, version: tuple[str, int, float, bool], seen: float) -> None:
        with contextlib.suppress(StoreError):  # a help for one-off passes, no more
            atomic_write(
                self._watch_file(),
                json.dumps({"version": list(version), "seen": seen}) + "\n",
                fsync=False,
            )

    def _locked(self) -> AbstractContextManager[IO[str]]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.path.parent}: {exc.strerror}") from None
        return locked(self.path.with_name("lease.lock"))


def who(holder: Holder | None) -> str:
    """The holder in an operator's words."""
    if holder is None:
        return "nobody"
    return f"pid {holder.pid} on {holder.host}"
