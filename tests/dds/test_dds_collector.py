"""The service's cycle collection: none on the request path, sweeps on a schedule.

The service turns CPython's automatic collector off and freezes its
start-up state, relying on two facts checked here: a request answered over a
kept-alive connection leaves no reference cycle behind, and a sweep does find
the cycles that something else made, frozen or not.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from dds_helpers import SECRET, RawConn, serving

from guardctl.config import load_settings
from guardctl.dds.collector import Collector
from guardctl.dds.dataset import JobSpec, index_range
from guardctl.dds.memory import plain_record
from guardctl.dds.service import open_ledger


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collector_restored() -> Iterator[None]:
    """Whatever a test does to the collector, leave it on and nothing frozen."""
    yield
    gc.unfreeze()
    gc.enable()


async def _cycles_left_by_requests(store: Path) -> dict[str, int]:
    """Count the objects in cycles each kind of request left, over kept-alive connections."""
    async with serving(store) as port:
        return await _requests_against(port)


async def _requests_against(port: int) -> dict[str, int]:
    conns = [RawConn(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(4)]
    counter = iter(range(10**6))

    async def lease_ack(conn: RawConn) -> None:
        lease = await conn.post("/v1/lease", {"worker": "w", "request_id": f"r{next(counter)}"})
        await conn.post("/v1/renew", {"lease": lease["lease"]})
        await conn.post("/v1/ack", {"lease": lease["lease"], "samples": 10, "seconds": 0.1})

    async def combined(conn: RawConn) -> None:
        lease = await conn.post("/v1/lease", {"worker": "w", "request_id": f"r{next(counter)}"})
        nxt = {"worker": "w", "request_id": f"r{next(counter)}"}
        reply = await conn.post("/v1/ack", {"lease": lease["lease"], "next": nxt})
        await conn.post("/v1/ack", {"lease": reply["next"]["lease"]})

    async def step(conn: RawConn) -> None:
        await conn.post("/v1/step", {"worker": "w", "rank": 0, "world": 1, "step": next(counter)})

    async def refused(conn: RawConn) -> None:
        assert (await conn.post("/v1/ack", {"lease": "x"}))["http_status"] == 400
        assert (await conn.post("/v1/lease", {}, secret="wrong"))["http_status"] == 401

    left: dict[str, int] = {}
    try:
        for name, kind in (
            ("lease, renew, ack", lease_ack),
            ("ack with next lease", combined),
            ("step", step),
            ("refused", refused),
        ):
            await asyncio.gather(*(kind(c) for c in conns))  # warm: first-use caches
            gc.collect()
            gc.disable()
            for _ in range(50):
                await asyncio.gather(*(kind(c) for c in conns))
            left[name] = gc.collect()
            gc.enable()
    finally:
        for conn in conns:
            conn.writer.close()
    return left


def _one_connection(port: int) -> None:
    """Connect, lease, close: blocking, from a thread (no asyncio transport of its own)."""
    body = b'{"worker": "w", "request_id": "' + os.urandom(8).hex().encode() + b'"}'
    request = (
        f"POST /v1/lease HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Authorization: Bearer {SECRET}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request + body)
        while sock.recv(65536):
            pass


async def _cycles_left_by_connections(store: Path, count: int) -> int:
    async with serving(store) as port:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            await loop.run_in_executor(pool, _one_connection, port)  # warm
            await asyncio.sleep(0.1)
            gc.collect()
            gc.disable()
            for _ in range(count):
                await loop.run_in_executor(pool, _one_connection, port)
            await asyncio.sleep(0.2)  # every connection_lost has run
            left = gc.collect()
            gc.enable()
    return left


def test_requests_leave_no_reference_cycles(tmp_path: Path, collector_restored: None) -> None:
    """What lets the service run without automatic collections: 200 requests of each kind
    over kept-alive connections leave no garbage cycle (one per request would be 200+)."""
    # A failing kind means a change made the request path build cycles: find and break
    # them (gc.DEBUG_SAVEALL shows them), or they pile up for a minute between sweeps.
    left = asyncio.run(_cycles_left_by_requests(tmp_path))
    assert left == {"lease, renew, ack": 0, "ack with next lease": 0, "step": 0, "refused": 0}


def test_closed_connections_leave_no_reference_cycles(
    tmp_path: Path, collector_restored: None
) -> None:
    """Before Python 3.12 each closed connection left its transport in a cycle (7 objects,
    its socket among them) until the next sweep; the service's server breaks it."""
    assert asyncio.run(_cycles_left_by_connections(tmp_path, 50)) == 0


def test_start_freezes_and_turns_automatic_collection_off(collector_restored: None) -> None:
    collector = Collector()
    collector.start()
    assert not gc.isenabled()
    assert gc.get_freeze_count() > 0
    collector.stop()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_sweep_finds_new_cycles_and_leaves_the_start_up_state_frozen(
    collector_restored: None,
) -> None:
    collector = Collector(sweep_s=3600)
    collector.start()
    frozen = gc.get_freeze_count()
    cycle = weakref.ref(_Cycle())  # garbage at once, and only a sweep can free it
    assert cycle() is not None
    assert collector.sweep() >= 1 and cycle() is None
    assert collector.stats.sweeps == 1 and collector.stats.collected >= 1
    assert collector.stats.longest_ms >= collector.stats.last_ms > 0
    # Nothing new frozen (frozen objects still leave when freed, so it may be fewer).
    assert gc.get_freeze_count() <= frozen and not gc.isenabled()


def test_a_cycle_frozen_at_start_waits_for_a_sweep_of_everything(
    collector_restored: None,
) -> None:
    """What a restore relies on: the ledger it replaces was frozen when the service started."""
    held = _Cycle()
    cycle = weakref.ref(held)
    collector = Collector(sweep_s=3600)
    collector.start()
    del held
    collector.sweep()
    assert cycle() is not None  # frozen: an ordinary sweep does not walk it
    collector.sweep(everything=True)
    assert cycle() is None
    assert gc.get_freeze_count() > 0 and not gc.isenabled()


def test_the_service_sweeps_on_its_schedule(collector_restored: None) -> None:
    async def for_a_while() -> Collector:
        collector = Collector(sweep_s=0.02)
        collector.start()
        task = asyncio.create_task(collector.run())
        await asyncio.sleep(0.3)
        task.cancel()
        return collector

    assert asyncio.run(for_a_while()).stats.sweeps >= 2


def test_lease_records_add_nothing_for_a_sweep_to_walk(
    tmp_path: Path, collector_restored: None
) -> None:
    """A sweep's pause is what is tracked: the ledger's lease records (and their expiry
    entries) must not be, or a sweep would walk two objects per lease ever granted."""
    settings = load_settings(assignments=(f"store.root={tmp_path}",), environ={})
    ledger, _ = open_ledger(settings, "plain", JobSpec(index_range(1_000_000), 10, 1, 7, True, 0))
    gc.collect()
    before = len(gc.get_objects())
    for n in range(20_000):
        reply = ledger.lease(f"w{n % 64}", f"r{n}")
        ledger.ack(reply["lease"])
        if n % 1000 == 0:
            ledger.db.flush()
    ledger.db.flush()
    assert len(gc.get_objects()) - before < 2_000  # not 40 000
    assert not any(gc.is_tracked(lease) for lease in ledger.leases.values())
    assert not any(gc.is_tracked(entry) for entry in ledger.heap)
    ledger.db.close()


def test_plain_record_keeps_the_tuple() -> None:
    record = plain_record((1, "r", 2.5, None))
    assert record == (1, "r", 2.5, None) and not gc.is_tracked(record)
