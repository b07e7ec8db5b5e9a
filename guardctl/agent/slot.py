"""One collector run under its own timeout, with its health recorded.

Each sample runs a collector in a daemon thread and waits for it until its
deadline. A collector that overruns is reported ``timeout`` and, while its
call is still stuck (an NVML call on a lost GPU can block for minutes), later
samples report it ``busy`` instead of piling up threads. A collector that says
it cannot run here (:class:`CollectorUnavailable`) is asked again only every
``retry_s`` seconds. Health changes are logged once, on the transition.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from guardctl.collectors import Collector, CollectorUnavailable, Record
from guardctl.telemetry.schema import make_record


@dataclass
class CollectorHealth:
    """How a collector's last sample went (the agent's self-metrics)."""

    name: str
    state: str = "new"  # ok, partial, error, timeout, busy, unavailable
    ok: bool = False
    duration_s: float = 0.0
    records: int = 0
    error: str = ""
    last_ok_ts: float | None = None
    failures: int = 0  # samples not ok since the agent started

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def record(self, node: str, ts: float) -> Record:
        """This sample's health as a schema-v1 ``agent`` record, for the store."""
        return make_record(
            "agent",
            node,
            ts,
            collector=self.name,
            state=self.state,
            ok=self.ok,
            duration_s=round(self.duration_s, 6),
            error=self.error,
        )


class _Call:
    """One collect() call running in its thread."""

    def __init__(self, collector: Collector, node: str, ts: float) -> None:
        self.done = threading.Event()
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.duration_s = 0.0
        self.thread = threading.Thread(
            target=self._run,
            args=(collector, node, ts),
            name=f"collector-{collector.name}",
            daemon=True,
        )
        self.thread.start()

    def _run(self, collector: Collector, node: str, ts: float) -> None:
        try:
            self.records = collector.collect(node, ts)
        except BaseException as exc:  # a plugin bug must not take the agent down
            self.error = exc
        finally:
            self.duration_s = time.perf_counter() - self.started
            self.done.set()


class CollectorSlot:
    """A collector, its timeout, and its health across samples."""

    def __init__(
        self, collector: Collector, timeout_s: float, retry_s: float, log: logging.Logger
    ) -> None:
        self.collector = collector
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.log = log
        self.health = CollectorHealth(collector.name)
        self._call: _Call | None = None
        self._stuck = False
        self._retry_at = 0.0

    @property
    def name(self) -> str:
        return self.collector.name

    def start(self, node: str, ts: float) -> None:
        """Start this sample's call (unless unavailable for now, or still stuck)."""
        self._stuck = self._call is not None and not self._call.done.is_set()
        if self._stuck:
            return  # no second thread into a hung library: finish() reports busy
        # A call that timed out and has finished since is dropped: what it read
        # is late, from reads spread over its stall.
        self._call = None
        if self.health.state == "unavailable" and time.monotonic() < self._retry_at:
            return
        self._call = _Call(self.collector, node, ts)

    def finish(self, deadline: float) -> list[Record]:
        """Wait for this sample's call until *deadline* (perf_counter); return its records."""
        call = self._call
        if call is None:
            return []  # unavailable, not due for a retry
        if self._stuck:
            stuck_s = time.perf_counter() - call.started
            self._set("busy", f"still in the call that timed out {stuck_s:.0f} s ago")
            self.health.duration_s = stuck_s
            return []
        if not call.done.wait(max(0.0, deadline - time.perf_counter())):
            self._set("timeout", f"no answer within {self.timeout_s:g} s")
            self.health.duration_s = time.perf_counter() - call.started
            return []
        self._call = None
        self.health.duration_s = call.duration_s
        return self._outcome(call)

    def _outcome(self, call: _Call) -> list[Record]:
        if isinstance(call.error, CollectorUnavailable):
            self._retry_at = time.monotonic() + self.retry_s
            self._set("unavailable", str(call.error))
            return []
        if call.error is not None:
            self._set("error", f"{type(call.error).__name__}: {call.error}")
            return []
        warnings: dict[str, str] = getattr(self.collector, "warnings", {}) or {}
        if warnings:
            self._set("partial", "; ".join(f"{k}: {v}" for k, v in sorted(warnings.items())))
        else:
            self._set("ok", "")
        self.health.records = len(call.records)
        self.health.last_ok_ts = time.time()
        return call.records

    def _set(self, state: str, error: str) -> None:
        health = self.health
        if state != health.state:
            if state == "ok":
                if health.state != "new":
                    self.log.info("collector %s: ok again", self.name)
            elif state == "unavailable":
                self.log.warning("collector %s: unavailable: %s", self.name, error)
            else:
                self.log.warning("collector %s: %s: %s", self.name, state, error)
        health.state = state
        health.ok = state in ("ok", "partial")
        health.error = error
        if not health.ok:
            health.failures += 1
            health.records = 0

    def close(self) -> None:
        """Close the collector, unless a call is stuck in it (it is a daemon thread)."""
        if self._call is None or self._call.done.is_set():
            self.collector.close()
