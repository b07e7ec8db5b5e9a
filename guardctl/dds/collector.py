"""The service's cycle collection: none on the request path; a sweep every minute.

CPython's collector starts a young collection once the count of new container
objects passes a threshold, and stops the event loop while it walks them. But
the count goes down whenever an older object is freed, so under the service's
load (every acknowledgement replaces a lease's record) the young generation
grew to 40 000 objects between two collections: 8-20 ms pauses, several times
a second. At 10 000 operations/s on 1024 connections the loop is about 0.8
busy and the backlog of a pause takes four times the pause to drain, so these
pauses set the latency's 99th percentile. Collecting on a clock instead does
not help much: with a thousand connections open, the objects of each
connection's next request are always young (about 12 000), so every young
collection, however frequent, took at least 4 ms (``bench/dds_throughput.py``).

The request path makes no reference cycles at all, nor does a closed
connection once the service's server breaks the one asyncio leaves before
Python 3.12 (``tests/dds/test_dds_collector.py`` checks both); a restore of
the ledger or an unusual error may. So the service

* at start, collects once and freezes whatever is alive (``gc.freeze``): its
  code, its settings and the ledger as loaded, about 40 000 objects that live
  as long as it does and that no sweep walks again;
* turns the automatic collector off;
* sweeps every ``SWEEP_S``: collects what was made since (the connections,
  mostly). The ledger's records are never tracked (``memory.plain_record``),
  so a sweep walks neither the leases nor the start-up state: its pause is set
  by the connections open. A sweep is logged and counted in the service's
  status.
* after a restore, which replaces the ledger, sweeps everything (frozen or
  not) and freezes again, as a start does.

Why not unfreeze and walk everything at each sweep, freezing what is alive again
every second in between: that costs 16-24 ms per sweep at 1024 connections (about
60 000 objects, nearly every visit a cache miss in a large heap), enough to move
the 99th percentile at 10 000 operations/s past 20 ms (``bench/dds_throughput.py``).

What cycles there are wait up to a minute to be freed; one through an object
frozen at start waits for the next restore.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("guardctl.dds")

SWEEP_S = 60.0


@dataclass
class Sweeps:
    sweeps: int = 0
    collected: int = 0  # objects found in garbage cycles, over all sweeps
    last_ms: float = 0.0  # how long the last sweep stopped the loop
    longest_ms: float = 0.0


class Collector:
    """Owns the process's collector while a service runs (see the module's note)."""

    def __init__(self, sweep_s: float = SWEEP_S) -> None:
        self.sweep_s = sweep_s
        self.stats = Sweeps()
        self._was_enabled = gc.isenabled()

    def start(self) -> None:
        """Collect what start-up left and freeze the rest (it lives as long as the service);
        from now on, only this collects."""
        gc.collect()
        gc.freeze()
        gc.disable()

    def stop(self) -> None:
        """Leave the process's collector as it was found, with nothing frozen."""
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def sweep(self, *, everything: bool = False) -> int:
        """Collect the garbage cycles made since start (*everything*: frozen ones too, and
        freeze what survives); return how many objects were in them."""
        began = time.perf_counter()
        if everything:
            gc.unfreeze()
        collected = gc.collect()
        if everything:
            gc.freeze()
        paused_ms = (time.perf_counter() - began) * 1000
        stats = self.stats
        stats.sweeps += 1
        stats.collected += collected
        stats.last_ms = paused_ms
        stats.longest_ms = max(stats.longest_ms, paused_ms)
        log.info("collector sweep: %d objects in cycles, %.0f ms", collected, paused_ms)
        return collected

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            self.sweep()
