#!/usr/bin/env python3
"""Benchmark: the event loop's CPU per request of the service's HTTP layer, alone.

The CPU time of the thread that runs the event loop, per request, is what
limits the service at a thousand ranks (docs/dds.md), and unlike throughput
it is little changed by other workloads taking the machine's cores. Here a
server (``guardctl.dds.http_server``, with the job's secret checked, answering
every request at once with a small JSON body) runs in a thread of this
process; a client process drives it over loopback with N keep-alive
connections, one request at a time on each. The baseline, in the same run
and on the same connections' traffic, is a bare asyncio protocol that
answers each complete request with a canned response after finding the end
of its head (no parser, no checks): the floor of asyncio itself.

    python3 bench/dds_http_cost.py [--requests 40000] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from guardctl.dds.http_server import Request, Server

SECRET = b"Bearer bench"
REPLY = b'{"status": "ok", "job": "bench"}'
CANNED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(REPLY),
    REPLY,
)

CLIENT = r"""
import asyncio, sys
port, clients, total = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
REQUEST = (b"POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
           b"Authorization: Bearer bench\r\n\r\n{}")
async def one(count):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    writer.close()
async def main():
    await asyncio.gather(*(one(total // clients) for _ in range(clients)))
asyncio.run(main())
"""


class Bare(asyncio.Protocol):
    """The floor: answer each request once its head (and its 2-byte body) is in."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0 or len(self.buffer) < end + 6:
                return
            self.buffer = self.buffer[end + 6 :]
            assert self.transport is not None
            self.transport.write(CANNED)


def _answer(request: Request) -> None:
    request.answer(200, REPLY)


def _server(kind: str) -> Callable[[], Any]:
    async def start() -> tuple[int, Callable[[], Any]]:
        loop = asyncio.get_running_loop()
        if kind == "bare":
            server = await loop.create_server(Bare, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            return port, server.close
        try:
            http = Server(_answer, SECRET)
        except TypeError:  # an older http_server (no secret check of its own): measure it as is
            http = Server(_answer)  # type: ignore[call-arg]
        port = await http.start("127.0.0.1", 0)
        return port, http.stop_listening

    return start


def measure(kind: str, clients: int, requests: int) -> dict[str, Any]:
    """Event-loop thread CPU per request, and the wall time, for one server kind."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["port"], box["stop"] = loop.run_until_complete(_server(kind)())
        ready.set()
        loop.run_forever()
        box["cpu"] = time.thread_time()

    thread = threading.Thread(target=run)
    thread.start()
    ready.wait()
    cpu0 = asyncio.run_coroutine_threadsafe(_thread_time(), loop).result()
    wall0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", CLIENT, str(box["port"]), str(clients), str(requests)],
        check=True,
        timeout=600,
    )
    wall = time.perf_counter() - wall0
    cpu1 = asyncio.run_coroutine_threadsafe(_thread_time(), loop).result()
    loop.call_soon_threadsafe(box["stop"])
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    done = requests // clients * clients
    return {
        "kind": kind,
        "requests": done,
        "loop_cpu_us_per_request": round((cpu1 - cpu0) / done * 1e6, 2),
        "requests_per_s": round(done / wall),
    }


async def _thread_time() -> float:
    return time.thread_time()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="bare and guardctl alternated")
    args = parser.parse_args()
    results: dict[str, Any] = {"rounds": []}
    for _ in range(args.rounds):
        bare = measure("bare", args.clients, args.requests)
        ours = measure("guardctl", args.clients, args.requests)
        ours["ratio_to_bare"] = round(
            ours["loop_cpu_us_per_request"] / bare["loop_cpu_us_per_request"], 2
        )
        results["rounds"].append([bare, ours])
        print(json.dumps([bare, ours]), file=sys.stderr)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
