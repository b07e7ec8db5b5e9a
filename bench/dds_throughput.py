#!/usr/bin/env python3
"""Benchmark: lease + acknowledge throughput and latency of the data-sharding service.

Starts a real ``guardctl dds serve`` (its own process) on loopback and drives it
from this process with 64, 256 and 1024 concurrent clients (lean asyncio streams, one
connection each), each looping lease -> ack as fast as it can (closed loop), then with the
acknowledgement and the next lease in one request (what ``Client.shards()``
does; one request, two operations), then both again as an open loop: each
client a Poisson stream of arrivals, together offering each rate of
--paced-ops (2000 and 10000 operations/s: what a job whose workers compute
between leases looks like, and the target rate), latency counted from each
arrival. In a closed loop the mean latency is clients / throughput (Little's
law), so its p99 says more about the client count than about the service;
the open-loop points measure the latency at a given load. The baseline, measured in the
same run against the same service, is the bare HTTP round trip (GET
/v1/health: authentication, no ledger, no SQLite), so the ratio shows what the
accounting and the group-committed database cost. Also measured: the CPU split
between the service (its event loop plus its commit process) and the load
generator, how busy the whole machine was (other workloads share its cores:
``machine_busy_cores`` minus the two is what they took), the statements per
commit, and
the synchronous client's sequential lease + ack latency (stdlib http.client,
what training scripts use) against an aiohttp client driven from a background
event loop.

    python3 bench/dds_throughput.py            # 5 s per point
    python3 bench/dds_throughput.py --quick    # 1.5 s per point, for CI
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from guardctl.config import load_settings
from guardctl.dds import Client
from guardctl.limits import raise_open_files_limit

JOB = "bench"


def start_service(store: Path, loop: str) -> tuple[subprocess.Popen[bytes], str, int, str]:
    env = {**os.environ, "GUARDCTL_STORE": str(store)}
    argv = [
        sys.executable,
        "-m",
        "guardctl",
        "--set",
        f"dds.event_loop={loop}",
        "--set",
        "dds.lease_s=600",
        "--set",
        "dds.bind=127.0.0.1",
        "dds",
        "serve",
        "--job",
        JOB,
        "--records",
        "20000000",
        "--shard-size",
        "10",
    ]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    address = store / "dds" / JOB / "address.json"
    deadline = time.monotonic() + 120  # making 2 million shards takes 30 s on a busy machine
    while not address.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the service did not start")
        time.sleep(0.05)
    data = json.loads(address.read_text())
    secret = (store / "dds" / JOB / "secret").read_text().strip()
    return proc, data["host"], int(data["port"]), secret


class _Connection:
    """One keep-alive HTTP/1.1 connection of the load generator.

    Deliberately lean (asyncio streams, no client library): the load generator
    shares the two cores with the service, and every cycle it saves is one the
    service can use. The training-side client is measured separately below.
    """

    def __init__(self, host: str, port: int, secret: str) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {secret}\r\n".encode()

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def call(self, method: str, path: str, body: bytes = b"") -> bytes:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        ).encode()
        self.writer.write(head + self.auth + b"\r\n" + body)
        headers = await self.reader.readuntil(b"\r\n\r\n")
        status = int(headers[9:12])
        length = 0
        for line in headers.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        payload = await self.reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"{path}: HTTP {status}: {payload[:200]!r}")
        return payload

    def close(self) -> None:
        self.writer.close()


async def _drive(
    host: str,
    port: int,
    secret: str,
    clients: int,
    seconds: float,
    mode: str,
    paced_ops: float = 0.0,
    on_clock: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One point; *on_clock* is called right when the clock starts and again when it stops."""
    latencies: list[float] = []
    requests = [0]
    # Request ids: unique across the run (the service is shared by all points), and cheap.
    ids = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count())
    go = asyncio.Event()
    stop_at = [0.0]

    async def one(worker: str) -> None:
        conn = _Connection(host, port, secret)
        await conn.open()  # connect before the clock runs
        await conn.call("GET", "/v1/health")
        await go.wait()
        try:
            rng = random.Random(worker)
            held: int | None = None  # combined mode: the lease to acknowledge next
            due = time.perf_counter()
            while time.perf_counter() < stop_at[0]:
                arrival: float | None = None
                if paced_ops:
                    # Open loop: this client's share of the offered load as a Poisson stream of
                    # arrivals, scheduled whatever the replies; latency counts from the arrival,
                    # so a client still busy with the last one shows the wait (no coordinated
                    # omission). One arrival is a lease and its acknowledgement: two operations.
                    due += rng.expovariate(paced_ops / 2 / clients)
                    if due >= stop_at[0]:
                        break
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    arrival = due
                if mode == "health":
                    t0 = time.perf_counter()
                    await conn.call("GET", "/v1/health")
                    latencies.append(time.perf_counter() - t0)
                    requests[0] += 1
                    continue
                if mode == "ack+lease combined" and held is not None:
                    t0 = arrival or time.perf_counter()
                    body = orjson.dumps(
                        {"lease": held, "next": {"worker": worker, "request_id": next(ids)}}
                    )
                    reply = orjson.loads(await conn.call("POST", "/v1/ack", body))
                    assert reply["counted"]
                    held = reply["next"]["lease"]
                    latency = time.perf_counter() - t0
                    latencies.extend((latency, latency))  # two operations, one request
                    requests[0] += 1
                    continue
                t0 = arrival or time.perf_counter()
                body = orjson.dumps({"worker": worker, "request_id": next(ids)})
                lease = orjson.loads(await conn.call("POST", "/v1/lease", body))
                t1 = time.perf_counter()
                if mode == "ack+lease combined":
                    held = lease["lease"]
                    latencies.append(t1 - t0)
                    requests[0] += 1
                    continue
                ack = orjson.dumps({"lease": lease["lease"]})
                assert orjson.loads(await conn.call("POST", "/v1/ack", ack))["counted"]
                latencies.extend((t1 - t0, time.perf_counter() - t1))
                requests[0] += 2
        finally:
            conn.close()

    tasks = [asyncio.create_task(one(f"w{i}")) for i in range(clients)]
    await asyncio.sleep(0.5 + clients / 500)  # every client connected (not timed)
    if on_clock is not None:
        on_clock()
    started = time.perf_counter()
    stop_at[0] = started + seconds
    go.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    if on_clock is not None:
        on_clock()
    latencies.sort()
    return {
        "ops": len(latencies),
        "ops_per_s": round(len(latencies) / elapsed),
        "requests_per_s": round(requests[0] / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
    }


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _machine_busy_s() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def measure(
    server: psutil.Process,
    host: str,
    port: int,
    secret: str,
    clients: int,
    seconds: float,
    mode: str,
    paced_ops: float = 0.0,
) -> dict[str, Any]:
    """One point; the service's CPU counts its commit process too (its own child).

    The CPU figures cover only the timed interval: the snapshots are taken when
    the load generator starts and stops its clock, not around the connecting of
    the clients and the pause before the start (at 1024 clients those took
    longer than the timed interval and made the machine look idle).
    """
    helpers = server.children(recursive=True)
    marks: list[tuple[float, float, float, float, float]] = []

    def snapshot() -> None:
        own = resource.getrusage(resource.RUSAGE_SELF)
        marks.append(
            (
                time.perf_counter(),
                _cpu_s(server),
                sum(_cpu_s(p) for p in helpers),
                own.ru_utime + own.ru_stime,
                _machine_busy_s(),
            )
        )

    # The load generator's own collections would stop its clients and show as the service's
    # latency: none while it runs (it makes no cycles worth collecting over a point).
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        result = asyncio.run(
            _drive(host, port, secret, clients, seconds, mode, paced_ops, on_clock=snapshot)
        )
    finally:
        gc.enable()
        gc.unfreeze()
    (wall0, s0, h0, c0, m0), (wall1, s1, h1, c1, m1) = marks
    wall = wall1 - wall0
    machine = (m1 - m0) / wall
    loop_cpu = (s1 - s0) / wall
    server_cpu = loop_cpu + (h1 - h0) / wall
    client_cpu = (c1 - c0) / wall
    result.update(
        ops_per_server_core_s=round(result["ops_per_s"] / max(server_cpu, 0.01)),
        clients=clients,
        mode=mode if not paced_ops else f"{mode} paced at {paced_ops:.0f} ops/s",
        server_cores=round(server_cpu, 2),
        server_loop_cores=round(loop_cpu, 2),
        loadgen_cores=round(client_cpu, 2),
        # Everything the machine ran: above server + loadgen, other workloads took cores.
        machine_busy_cores=round(machine, 2),
    )
    return result


def sync_client_latency(store: Path, ops: int) -> dict[str, Any]:
    """Sequential lease + ack from one rank: stdlib client vs aiohttp in a background loop."""
    settings = load_settings(assignments=(f"store.root={store}",), environ={})
    client = Client(JOB, worker="sync", settings=settings)
    t0 = time.perf_counter()
    for _ in range(ops // 2):
        shard = client.lease()
        assert shard is not None and client.ack(shard)
    stdlib_ms = (time.perf_counter() - t0) / ops * 1000
    client.close()

    address = json.loads((store / "dds" / JOB / "address.json").read_text())
    secret = (store / "dds" / JOB / "secret").read_text().strip()
    url = f"http://{address['host']}:{address['port']}"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    session = asyncio.run_coroutine_threadsafe(_session(secret), loop).result()

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            async with session.post(url + path, json=body) as r:
                return dict(await r.json())

        return asyncio.run_coroutine_threadsafe(go(), loop).result()

    t0 = time.perf_counter()
    for _ in range(ops // 2):
        lease = call("/v1/lease", {"worker": "bg", "request_id": uuid.uuid4().hex})
        call("/v1/ack", {"lease": lease["lease"]})
    aiohttp_ms = (time.perf_counter() - t0) / ops * 1000
    asyncio.run_coroutine_threadsafe(session.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    return {
        "stdlib_http_client_ms": round(stdlib_ms, 3),
        "aiohttp_background_loop_ms": round(aiohttp_ms, 3),
    }


async def _session(secret: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {secret}"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (CI)")
    parser.add_argument("--seconds", type=float, help="seconds per point")
    parser.add_argument("--clients", default="64,256,1024")
    parser.add_argument(
        "--paced-ops",
        default="2000,10000",
        help="offered loads of the open-loop points, operations/s (comma list)",
    )
    parser.add_argument(
        "--event-loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="the service's event loop (uvloop is optional: installed or not)",
    )
    args = parser.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    open_files = raise_open_files_limit(65536)  # 1024 client connections in this one process
    results: dict[str, Any] = {"cpus": os.cpu_count(), "seconds_per_point": seconds, "points": []}
    with tempfile.TemporaryDirectory(prefix="dds-bench-") as tmp:
        proc, host, port, secret = start_service(Path(tmp), args.event_loop)
        results["event_loop"] = args.event_loop
        try:
            server = psutil.Process(proc.pid)
            for clients in (int(c) for c in args.clients.split(",")):
                if clients + 64 > open_files:
                    results["points"].append(
                        {"clients": clients, "skipped": f"open files limit {open_files}"}
                    )
                    continue
                base = measure(server, host, port, secret, clients, seconds, "health")
                dds = measure(server, host, port, secret, clients, seconds, "lease+ack")
                dds["ratio_to_bare_http"] = round(dds["ops_per_s"] / max(base["ops_per_s"], 1), 2)
                combined = measure(
                    server, host, port, secret, clients, seconds, "ack+lease combined"
                )
                combined["ratio_to_bare_http"] = round(
                    combined["ops_per_s"] / max(base["ops_per_s"], 1), 2
                )
                paced = [
                    measure(server, host, port, secret, clients, seconds, mode, float(rate))
                    for rate in args.paced_ops.split(",")
                    for mode in ("lease+ack", "ack+lease combined")
                ]
                results["points"] += [base, dds, combined, *paced]
                for point in (base, dds, combined, *paced):
                    print(json.dumps(point), file=sys.stderr)
            status = Client(
                JOB, settings=load_settings(assignments=(f"store.root={tmp}",), environ={})
            ).status()
            service = status["service"]
            results["statements_per_commit"] = round(
                service["statements"] / max(service["commits"], 1), 1
            )
            results["collector"] = service["collector"]  # sweeps during the run, if any
            results["sequential_client"] = sync_client_latency(
                Path(tmp), 400 if args.quick else 2000
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
