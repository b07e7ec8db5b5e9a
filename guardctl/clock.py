"""The clocks guardctl reads, and the skew between the hosts that write the store.

Two clocks, for two jobs. The wall clock dates records (telemetry, the action log); it may be
off between hosts. The monotonic clock (``CLOCK_BOOTTIME``: it counts a suspended machine's
sleep too) times durations on one host, the controller's lease above all; it never jumps, and no
other host's clock enters into it.

Skew: each host that writes the store (the controller, the node agents) writes a heartbeat,
``<store>/clocks/<role>.<name>.json``, holding its wall clock, and then sets the file's mtime to
"now" *by the file server's clock* (``utime`` without times: NFS sends SET_TO_SERVER_TIME). A
heartbeat's wall time minus its mtime is how far that host's clock is from the file server's;
the file server's own error cancels out between two hosts. The controller refuses to act while
an agent heard from recently (:data:`FRESH_S`) is more than ``control.max_clock_skew_s`` away
from its own clock, or while it cannot measure its own (the store not writable).

:class:`Clock` is a constructor parameter of the lease and the controller so that a test can
skew or pause them; no setting reaches it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from guardctl.errors import StoreError
from guardctl.fileio import atomic_write
from guardctl.runner import this_writer
from guardctl.storage import layout

# A heartbeat older than this (by the file server's clock) is from a host that no longer
# writes: its clock is not judged.
FRESH_S = 900.0


class Clock:
    """This host's clocks: :meth:`wall` dates records, :meth:`mono` times the lease.

    *boot* names what the monotonic clock counts from (this boot of this machine), so that a
    reading kept in the store is only ever compared with one from the same clock.
    """

    def __init__(self) -> None:
        self.boot = this_writer().boot or f"pid-{os.getpid()}"

    def wall(self) -> float:
        return time.time()

    def mono(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Beat:
    """One host's heartbeat: who, and how far its wall clock was from the file server's."""

    role: str
    name: str
    skew_s: float  # this host's wall clock minus the file server's, when it wrote
    at: float  # when it wrote, by the file server's clock (the file's mtime)


def heartbeat_file(root: Path, role: str, name: str) -> Path:
    return layout.clocks_dir(root) / f"{role}.{name}.json"


def beat(root: Path, role: str, name: str, clock: Clock | None = None) -> Beat:
    """Write this host's heartbeat and measure its skew from the file server (StoreError)."""
    clock = clock or Clock()
    path = heartbeat_file(root, role, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        before = clock.wall()
        atomic_write(
            path, json.dumps({"role": role, "name": name, "wall": before}) + "\n", fsync=False
        )
        os.utime(path)  # the file server's "now"
        after = clock.wall()
        at = path.stat().st_mtime
    except OSError as exc:
        raise StoreError(f"cannot write the clock heartbeat {path}: {exc.strerror}") from None
    if abs(after - before) > 1.0:  # a slow write: measure from the wall time kept in the file
        return Beat(role, name, before - at, at)
    return Beat(role, name, (before + after) / 2 - at, at)


def read_beats(root: Path) -> list[Beat]:
    """Every heartbeat that can be read (a torn or foreign file is skipped)."""
    out = []
    try:
        files = sorted(layout.clocks_dir(root).glob("*.json"))
    except OSError:
        return []
    for path in files:
        try:
            at = path.stat().st_mtime
            raw = json.loads(path.read_text(encoding="utf-8"))
            out.append(Beat(str(raw["role"]), str(raw["name"]), float(raw["wall"]) - at, at))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def skew_refusal(
    root: Path, role: str, name: str, tolerance_s: float, clock: Clock | None = None
) -> str:
    """Why this host must not act now because of clocks, in one line ("" when it may act).

    Writes this host's heartbeat, then compares the agents' recent heartbeats with it.
    """
    try:
        mine = beat(root, role, name, clock)
    except StoreError as exc:
        return f"cannot tell whether the clocks agree ({exc})"
    off = [
        (b, b.skew_s - mine.skew_s)
        for b in read_beats(root)
        if b.role == "agent" and mine.at - b.at <= FRESH_S
    ]
    bad = sorted((b for b in off if abs(b[1]) > tolerance_s), key=lambda x: -abs(x[1]))
    if not bad:
        return ""
    shown = ", ".join(f"{b.name} {d:+.0f} s" for b, d in bad[:5])
    more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
    return (
        f"the clocks of {len(bad)} agent host(s) differ from this controller's by more "
        f"than control.max_clock_skew_s = {tolerance_s:g} s: {shown}{more}"
    )
