"""The node agent: sample every collector each interval and append the records to the store.

The agent is a foreground process (systemd runs it; see
``contrib/guardctl-agent.service``). One sample: start every collector in its
own thread, wait for each until its timeout, and queue what came back, and one health
record (kind ``agent``) per collector. The node's training ranks hand their step records
to the agent over a node-local socket (:mod:`guardctl.agent.handoff`), so the agent is the
node's one writer on the shared filesystem: every ``write_interval_s`` it appends everything
queued, of every kind, as one batch (one write, one fsync) to
``<store>/telemetry/<segment>/<node>.jsonl``, and rewrites the local status file with each
collector's health; at most once a minute, after a batch the store took, the node's
clock heartbeat (:mod:`guardctl.clock`). A crash loses what was queued, at most one
``write_interval_s``. SIGTERM or SIGINT ends it after the sample in progress, writing what
is queued and buffered if the store lets it.

The agent writes only into the store that ``guardctl store init`` marked: where the marker is
missing (the shared filesystem is not mounted, so its mount point is a local directory) the
batch is buffered and the status says why, and nothing is created on local disk.
"""

from __future__ import annotations

import errno
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from guardctl import clock, collectors
from guardctl.agent.handoff import Inbox, socket_path
from guardctl.agent.slot import CollectorSlot
from guardctl.collectors import Collector, Record
from guardctl.errors import StoreError
from guardctl.fileio import atomic_write
from guardctl.nodes import validate_name
from guardctl.sections.agent import AgentSettings
from guardctl.storage import layout, segments, store
from guardctl.storage.writer import BufferedStore, LineWriter
from guardctl.telemetry.mirror import Mirror
from guardctl.telemetry.schema import dumps

log = logging.getLogger("guardctl.agent")
BEAT_EVERY_S = 60.0  # the clock heartbeat's period (well inside guardctl.clock.FRESH_S)


def node_name(configured: str = "") -> str:
    """The node's name in records: the configured one, else the short hostname."""
    return validate_name(configured or socket.gethostname().split(".")[0])


class Agent:
    """The collectors of one node, the store they write to, and their health."""

    def __init__(
        self,
        settings: AgentSettings,
        store_root: Path,
        node: str,
        *,
        writer: LineWriter | None = None,
        make_collector: Callable[[str, AgentSettings], Collector] = collectors.create,
        segment_minutes: int = segments.DEFAULT_MINUTES,
    ) -> None:
        self.settings = settings
        self.root = store_root
        # [store] segment_minutes: how long each of this node's files covers
        self.segment_minutes = segments.check_minutes(segment_minutes)
        self.node = validate_name(node)
        if writer is None:
            writer = LineWriter(mirror=Mirror() if settings.column_files else None)
        if writer.guard is None:
            writer.guard = self.check_mounted
        self.store = BufferedStore(settings.buffer_records, log, writer)
        self.slots = [
            CollectorSlot(
                make_collector(name, settings),
                settings.timeouts.get(name, settings.collector_timeout_s),
                settings.retry_unavailable_s,
                log,
            )
            for name in settings.collectors
        ]
        self.samples = 0
        self.last_ts = 0.0
        self.inbox: Inbox | None = None  # the ranks' hand-off, while the agent runs
        self._queued: list[tuple[Path, str]] = []
        self._written_at = float("-inf")
        self._status_error = ""
        self._beat_at = float("-inf")
        self._states: tuple[object, ...] = ()

    def check_mounted(self) -> None:
        """Raise OSError unless the store root carries the marker of the site's shared store."""
        why = store.unmarked(self.root)
        if why:
            raise OSError(errno.ENOENT, why)

    def collect(self, ts: float) -> list[Record]:
        """One sample of every collector, run side by side, each under its timeout.

        After the collectors' records come their health records (kind ``agent``,
        one per collector), so that the analyzer can tell a collector that
        failed from a node that sent nothing.
        """
        started = time.perf_counter()
        for slot in self.slots:
            slot.start(self.node, ts)
        records: list[Record] = []
        for slot in self.slots:
            records.extend(slot.finish(started + slot.timeout_s))
        records.extend(slot.health.record(self.node, ts) for slot in self.slots)
        return records

    def sample(self, ts: float | None = None) -> bool:
        """Collect one sample, write it and all that is queued now; True if the store took all."""
        return self.tick(ts, write_now=True)

    def tick(
        self, ts: float | None = None, *, at: float | None = None, write_now: bool = False
    ) -> bool:
        """Collect one sample; append what is queued when ``write_interval_s`` has passed.

        *at* is the sample's place on the agent's grid (monotonic seconds), so that jitter does
        not put a write off by a whole interval. True if nothing is left unwritten (queued for
        the next write, or buffered by an outage).
        """
        ts = time.time() if ts is None else ts
        path = layout.node_telemetry_file(self.root, self.node, ts, self.segment_minutes)
        self._queued.extend((path, dumps(record)) for record in self.collect(ts))
        now = time.monotonic() if at is None else at
        if write_now or now - self._written_at >= self.settings.write_interval_s:
            self._written_at = now
            written = self.write_queued()
        else:
            written = False
        self.samples += 1
        self.last_ts = ts
        states = (self.store.state.writable, *(slot.health.state for slot in self.slots))
        if states != self._states or self.samples % self.settings.status_every == 0:
            self.write_status()
            self._states = states
        return written

    def write_queued(self) -> bool:
        """Append the queued records and the ranks' step records as one batch; True if taken."""
        items, self._queued = self._queued, []
        if self.inbox is not None:
            length = self.segment_minutes * 60
            files: dict[int, Path] = {}  # a file's name is made once per segment, not per record
            for ts, raw in self.inbox.take():
                segment = int(ts // length)
                if segment not in files:
                    files[segment] = layout.node_telemetry_file(
                        self.root, self.node, ts, self.segment_minutes
                    )
                items.append((files[segment], raw.decode().rstrip("\n")))
        # One file per segment: sorting by it (stably) keeps the batch one append per file.
        items.sort(key=lambda item: item[0])
        written = self.store.write(items)
        if written:
            self.beat()
        return written

    def open_inbox(self) -> None:
        """Listen for this node's ranks (setting ``handoff_socket``; never fatal)."""
        path = socket_path(self.node, self.settings.handoff_socket)
        if not path:
            return
        inbox = Inbox(path, self.node, self.root, log, capacity=self.settings.buffer_records)
        if inbox.open():
            self.inbox = inbox

    def beat(self) -> None:
        """Write this host's clock heartbeat (guardctl.clock) now and then; never fatal: the
        controller judges the skew of the agents it hears from."""
        now = time.monotonic()
        if now - self._beat_at < BEAT_EVERY_S:
            return
        self._beat_at = now
        try:
            clock.beat(self.root, "agent", self.node)
        except StoreError as exc:
            log.warning("%s", exc)

    def status(self) -> dict[str, Any]:
        """The agent's health: each collector's last sample and the store's state."""
        return {
            "node": self.node,
            "ts": self.last_ts,
            "samples": self.samples,
            "interval_s": self.settings.interval_s,
            "store": {"root": str(self.root), **asdict(self.store.state)},
            "handoff": self.inbox.stats.to_dict() if self.inbox else {"listening": False},
            "collectors": [slot.health.to_dict() for slot in self.slots],
        }

    def write_status(self) -> None:
        """Rewrite the local status file atomically (tmp + rename); never fatal."""
        target = self.settings.status_file
        if not target:
            return
        path = Path(target)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(self.status(), indent=1) + "\n")
            error = ""
        except OSError as exc:
            error = f"{path}: {exc.strerror or exc}"
        except StoreError as exc:
            error = str(exc)
        if error != self._status_error:
            if error:
                log.warning("cannot write status file %s", error)
            self._status_error = error

    def run(self, stop: threading.Event) -> None:
        """Sample every interval until *stop* is set; samples keep to the interval's grid."""
        interval = self.settings.interval_s
        log.info(
            "agent started: node %s, store %s, every %g s, collectors %s",
            self.node,
            self.root,
            interval,
            ", ".join(s.name for s in self.slots),
        )
        self.open_inbox()
        next_at = time.monotonic()
        while not stop.is_set():
            self.tick(at=next_at)
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # a slow sample: skip the missed ticks, don't burst
                next_at = now + interval - (now - next_at) % interval
            stop.wait(max(0.0, next_at - time.monotonic()))
        log.info("agent stopping after %d samples", self.samples)

    def close(self) -> None:
        """Write what is queued and buffered once more, then release collectors and files."""
        if self.inbox is not None:
            self.inbox.close()  # no more batches: ranks keep what was not answered
        if self._queued or self.inbox is not None or self.store.pending:
            self.write_queued()
        if self.store.pending:
            log.warning("agent exiting with %d records not written", len(self.store.pending))
        self.write_status()
        for slot in self.slots:
            slot.close()
        self.store.close()


def run_forever(agent: Agent) -> None:
    """Run *agent* until SIGTERM or SIGINT."""
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        agent.run(stop)
    finally:
        agent.close()
