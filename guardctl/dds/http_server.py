"""HTTP/1.1 for the data-sharding service: httptools' parser under an asyncio protocol.

The service answers a few fixed paths with small JSON bodies, thousands of
times a second, one request per connection at a time (each rank keeps one
connection alive). The parsing, the part that must be right for every odd
input, is llhttp's (Node.js's parser), through httptools, as in uvicorn.
What is here is the little a server adds to it: which request is which,
answers in the order the requests came, keep-alive, limits, and closing.

Why not a web framework: with aiohttp's server (which this service used
first) a request cost about 40 us of the event loop's CPU more than it does
here (measured with a bare health check on 1024 connections: 42-51 us per
request against 13), and with one core for the loop that was the service's
limit at 1024 ranks (docs/dds.md). Here a request is parsed in C, handed to
the service's handler as one small object, and answered with one write; no
task, future or stream per request.

A handler is called for every complete request and must answer it exactly
once (``Request.answer``), now or later (after the group commit that holds
its change). Answers on one connection go out in the order of the requests,
whatever order they are given in.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus

import httptools

log = logging.getLogger("guardctl.dds")

MAX_BODY = 64 * 1024
MAX_HEAD = 16 * 1024  # request line and headers together
MAX_PIPELINED = 32  # unanswered requests on one connection before it is read no further
IDLE_S = 75.0  # a connection with nothing in progress is closed after this long

Handler = Callable[["Request"], None]


_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


class Request:
    """One parsed request: what the service looks at, and how to answer it."""

    __slots__ = ("authorization", "body", "conn", "keep_alive", "method", "path", "response",
                 "too_large")  # fmt: skip

    def __init__(self, conn: Connection, method: bytes, path: bytes, authorization: bytes,
                 body: bytes, too_large: bool, keep_alive: bool) -> None:  # fmt: skip
        self.conn = conn
        self.method = method
        self.path = path
        self.authorization = authorization
        self.body = body
        self.too_large = too_large  # the body was over MAX_BODY (and was not kept)
        self.keep_alive = keep_alive
        self.response: bytes | None = None

    def answer(self, status: int, body: bytes) -> None:
        """Answer with a JSON *body*; a second answer, or one to a closed connection, is dropped."""
        if self.response is None:
            head = self.conn.head(status, len(body), self.keep_alive)
            self.response = head if self.method == b"HEAD" else head + body
            self.conn.answered()


class Connection(asyncio.Protocol):
    """One client connection: parses its requests and writes their answers in order."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()  # requests not yet written back, oldest first
        self.paused = False  # reading stopped: too many unanswered, or the client not reading
        self.writable = True
        self.last_active = 0.0
        self.refused = False  # a request could not be parsed: answered, closing, read no more
        self._start_message()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.last_active = self.server.loop.time()
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = self.server.loop.time()
        if self.refused:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, b"upgrades are not served here")
        except httptools.HttpParserError as exc:
            # A callback's own refusal (over a limit) reaches here wrapped: already answered.
            if not self.refused:
                self._refuse(400, f"malformed HTTP request: {exc}".encode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        transport, self.transport = self.transport, None
        # The parser holds this protocol, and so does the transport; drop our side of both
        # so that a closed connection is freed without a cycle collection (collector.py).
        self.parser = None  # type: ignore[assignment]
        self.queue.clear()
        # Before Python 3.12 the socket transport also keeps a bound method of itself for
        # good (python/cpython#100348); 3.12 drops it on close, and so does this.
        callback = getattr(transport, "_read_ready_cb", None)
        if getattr(callback, "__self__", None) is transport:
            transport._read_ready_cb = None  # type: ignore[union-attr]

    def pause_writing(self) -> None:  # the client is not reading its answers: stop reading
        self.writable = False
        self._pause()

    def resume_writing(self) -> None:
        self.writable = True
        self._resume()

    # -- httptools callbacks ------------------------------------------------------------------

    def _start_message(self) -> None:
        self.url = b""
        self.authorization = b""
        self.head_size = 0
        self.body: list[bytes] = []
        self.body_size = 0

    def on_message_begin(self) -> None:
        self._start_message()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if len(name) == 13 and name.lower() == b"authorization":
            self.authorization = value
        elif len(name) == 6 and name.lower() == b"expect":
            self._continue(value)

    def _continue(self, expectation: bytes) -> None:
        # curl asks before sending a body over 1 KiB; say go on (or it waits a second).
        if expectation.lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size <= MAX_BODY:
            self.body.append(body)
        else:
            self.body = []  # read to the end and answered 413; not kept

    def on_message_complete(self) -> None:
        parser = self.parser
        if parser.should_upgrade():
            return  # not served: the parser stops here and the request is refused (400)
        path, _, _ = self.url.partition(b"?")
        too_large = self.body_size > MAX_BODY
        body = b"" if too_large else b"".join(self.body)
        request = Request(self, parser.get_method(), path, self.authorization, body, too_large,
                          parser.should_keep_alive())  # fmt: skip
        self.queue.append(request)
        if len(self.queue) >= MAX_PIPELINED:
            self._pause()
        try:
            self.server.handler(request)
        except Exception:  # a bug: say so, answer, and keep serving the others
            log.exception("request %s %s failed", request.method, request.path)
            request.answer(500, b'{"error": "internal error of the service"}')

    # -- answering ----------------------------------------------------------------------------

    def head(self, status: int, length: int, keep_alive: bool) -> bytes:
        reason = _REASONS.get(status, b"Unknown")
        close = b"" if keep_alive else b"Connection: close\r\n"
        return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Date: %s\r\nServer: guardctl-dds\r\n%s\r\n"
                % (status, reason, length, self.server.date(), close))  # fmt: skip

    def answered(self) -> None:
        """Write what can go out: answers at the head of the queue, in request order."""
        queue = self.queue
        transport = self.transport
        while queue and queue[0].response is not None:
            request = queue.popleft()
            if transport is None or transport.is_closing():
                continue
            assert request.response is not None
            transport.write(request.response)
            if not request.keep_alive:
                transport.close()
                queue.clear()
                return
        if self.paused and len(queue) < MAX_PIPELINED // 2:
            self._resume()

    def _refuse(self, status: int, message: bytes) -> None:
        """Answer a request that could not be parsed, after those before it, and close."""
        self.refused = True
        request = Request(self, b"", b"", b"", b"", False, False)
        self.queue.append(request)
        request.answer(status, b'{"error": "%s"}' % message.replace(b'"', b"'"))

    def _pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if (self.paused and self.writable and len(self.queue) < MAX_PIPELINED
                and self.transport is not None and not self.transport.is_closing()):  # fmt: skip
            self.paused = False
            self.transport.resume_reading()

    def _count_head(self, size: int) -> None:
        self.head_size += size
        if self.head_size > MAX_HEAD:
            self._refuse(431, b"the request's head is over 16 KiB")
            raise _Refused


class _Refused(Exception):
    """Stops the parser from a callback: the request is answered with an error, and closing."""


class Server:
    """Listens on one address and hands every complete request to *handler*."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.loop = asyncio.get_running_loop()
        self.connections: set[Connection] = set()
        self.server: asyncio.Server | None = None
        self._date = b""
        self._date_at = -1
        self._idle_check: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, backlog: int = 4096) -> int:
        """Listen; return the port (the one the system chose for port 0)."""
        self.server = await self.loop.create_server(
            lambda: Connection(self), host, port, backlog=backlog, reuse_address=True
        )
        self._idle_check = self.loop.call_later(IDLE_S / 5, self._close_idle)
        for sock in self.server.sockets:
            address = sock.getsockname()
            if isinstance(address, tuple):
                return int(address[1])
        raise OSError("the server has no TCP socket")

    def date(self) -> bytes:
        """The Date header's value, made once a second."""
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._date = email.utils.formatdate(now, usegmt=True).encode()
        return self._date

    def _close_idle(self) -> None:
        """Close connections idle for IDLE_S with nothing in progress, as web servers do."""
        horizon = self.loop.time() - IDLE_S
        for conn in list(self.connections):
            if conn.last_active < horizon and not conn.queue and conn.transport is not None:
                conn.transport.close()
        self._idle_check = self.loop.call_later(IDLE_S / 5, self._close_idle)

    def stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._idle_check is not None:
            self._idle_check.cancel()

    async def close(self) -> None:
        """Stop listening and close every connection (what is answered is written first)."""
        self.stop_listening()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5.0)
