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
limit at 1024 ranks (``bench/dds_http_cost.py`` measures it). Here a request
is parsed in C, handed to the service's handler as one small object, and
answered with one write; no task, future or stream per request.

A handler is called for every complete request and must answer it exactly
once (``Request.answer``), now or later (after the group commit that holds
its change). Answers on one connection go out in the order of the requests,
whatever order they are given in; so do the interim ``100 Continue``s.

A hostile or broken client costs the service little: a request's head and
body must arrive within ``REQUEST_S`` of its first byte (bytes trickling in
do not extend it, nor the idle clock), a head is counted in raw bytes as it
arrives, the body's declared length and the job's secret are checked as soon
as the head is complete (before any of the body is read), the connections
are capped, and a refused connection is half-closed and drained for a moment
rather than reset, so that the client reads why.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hmac
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
MAX_CONNECTIONS = 16384  # open client connections; more are answered 503 and closed
IDLE_S = 75.0  # a connection with nothing in progress is closed after this long
REQUEST_S = 10.0  # a request's head and body must have arrived this long after its first byte
CHECK_S = 1.0  # how often the deadlines are looked at (a deadline is met to within this)
LINGER_S = 2.0  # a refused connection is drained this long for the client to read why
LINGER_BYTES = MAX_BODY  # ... or until this much more has come in, then reset

Handler = Callable[["Request"], None]

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Request:
    """One parsed request: what the service looks at, and how to answer it."""

    __slots__ = ("authorization", "body", "conn", "keep_alive", "method", "path", "response")

    def __init__(
        self,
        conn: Connection,
        method: bytes,
        path: bytes,
        authorization: bytes,
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self.conn = conn
        self.method = method
        self.path = path
        self.authorization = authorization
        self.body = body
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
        self.admitted = False  # counted against the cap (not refused at connection_made)
        self.now = 0.0  # the loop's time at the latest read
        self.last_active = 0.0  # the latest complete request (what the idle clock runs from)
        self.started = 0.0  # the first byte of the request being read (0: none in progress)
        self.in_head = False  # a request's head has begun and is not complete
        self.began = False  # ... and it began in the read being parsed
        self.head_raw = 0  # raw bytes of that head carried over from earlier reads
        self.body_in_read = 0  # body bytes of the request being read, in the read being parsed
        self.body_before = 0  # ... and of the request before it
        self.refused = False  # answered with an error, closing: what comes in is discarded
        self.eof = False  # the client has half-closed: answer what it asked, then close
        self.lingering: asyncio.TimerHandle | None = None
        self.discarded = 0
        self._start_message()

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        server = self.server
        self.now = self.last_active = server.loop.time()
        server.connections.add(self)
        if server.admitted >= server.max_connections:
            self._refuse(503, b"the service has too many connections; retry later")
            return
        self.admitted = True
        server.admitted += 1

    def data_received(self, data: bytes) -> None:
        self.now = self.server.loop.time()
        if self.refused:
            self._discard(len(data))
            return
        self.began = False
        self.body_in_read = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, b"upgrades are not served here")
        except httptools.HttpParserError as exc:
            # A callback's own refusal (over a limit) reaches here wrapped: already answered.
            if not self.refused:
                self._refuse(400, f"malformed HTTP request: {exc}".encode())
        if self.in_head and not self.refused:
            self._count_raw_head(data)

    def eof_received(self) -> bool:
        """The client sent all it will (half-close): answer what it asked, then close."""
        self.eof = True
        return bool(self.queue)  # True: keep the transport open to answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.admitted:
            self.admitted = False
            self.server.admitted -= 1
        if self.lingering is not None:
            self.lingering.cancel()
            self.lingering = None
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
        self.expect_continue = False
        self.unauthorised = False  # answered 401 already: the body is discarded, no handler
        self.head_size = 0
        self.body: list[bytes] = []
        self.body_size = 0

    def on_message_begin(self) -> None:
        self._start_message()
        self.started = self.now
        self.in_head = self.began = True
        self.head_raw = 0
        self.body_before, self.body_in_read = self.body_in_read, 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if len(name) == 13 and name.lower() == b"authorization":
            self.authorization = value
        elif len(name) == 14 and name.lower() == b"content-length":
            # llhttp has checked that it is a number; a length over the limit is refused
            # now, before a byte of the body is read.
            if int(value) > MAX_BODY:
                self._refuse(413, b"the body is over %d KiB" % (MAX_BODY // 1024))
                raise _Refused
        elif len(name) == 6 and name.lower() == b"expect":
            self.expect_continue = value.lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        self.in_head = False
        expected = self.server.authorization
        if expected is not None and not hmac.compare_digest(self.authorization, expected):
            # Answered now, before its body is read; the body (at most MAX_BODY: a longer one
            # was refused already) is dropped as it arrives, never kept, and no handler runs.
            self.unauthorised = True
            refusal = Request(self, b"", b"", b"", b"", self.parser.should_keep_alive())
            self.queue.append(refusal)
            refusal.answer(401, b'{"error": "not authorised for this job"}')
            return
        if self.expect_continue:
            # curl asks before sending a body over 1 KiB: say go on (or it waits a second),
            # in its place after the answers to the requests before this one.
            interim = Request(self, b"", b"", b"", b"", True)
            interim.response = _CONTINUE
            self.queue.append(interim)
            self.answered()

    def on_body(self, body: bytes) -> None:
        self.body_in_read += len(body)
        self.body_size += len(body)
        if self.body_size > MAX_BODY:  # chunked: no length to check beforehand
            self._refuse(413, b"the body is over %d KiB" % (MAX_BODY // 1024))
            raise _Refused
        if not self.unauthorised:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.started = 0.0
        self.last_active = self.now
        if self.unauthorised:
            return  # answered when its head was complete
        parser = self.parser
        if parser.should_upgrade():
            return  # not served: the parser stops here and the request is refused (400)
        path, _, _ = self.url.partition(b"?")
        body = b"".join(self.body)
        request = Request(
            self, parser.get_method(), path, self.authorization, body, parser.should_keep_alive()
        )
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
        return (
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Date: %s\r\nServer: guardctl-dds\r\n%s\r\n"
            % (status, reason, length, self.server.date(), close)
        )

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
                queue.clear()
                self._finish()
                return
        if self.eof and not queue and transport is not None:
            transport.close()  # half-closed by the client, and everything it asked is answered
        elif self.paused and len(queue) < MAX_PIPELINED // 2:
            self._resume()

    def _finish(self) -> None:
        """After the last answer: close; after a refusal, half-close and drain for a moment."""
        transport = self.transport
        assert transport is not None
        if not self.refused or self.eof or not transport.can_write_eof():
            transport.close()
            return
        # Closing with the client's bytes unread would reset the connection, and the client
        # could lose the answer before reading it: send our end (FIN) and drain a little.
        transport.write_eof()
        self.paused = False
        transport.resume_reading()
        self.lingering = self.server.loop.call_later(LINGER_S, transport.abort)

    def _refuse(self, status: int, message: bytes) -> None:
        """Answer a request that cannot be served, after those before it, and close."""
        self.refused = True
        self.in_head = False
        self.started = 0.0
        request = Request(self, b"", b"", b"", b"", False)
        self.queue.append(request)
        request.answer(status, b'{"error": "%s"}' % message.replace(b'"', b"'"))

    def _discard(self, size: int) -> None:
        self.discarded += size
        if self.discarded > LINGER_BYTES and self.transport is not None:
            self.transport.abort()

    def _pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if (
            self.paused
            and self.writable
            and len(self.queue) < MAX_PIPELINED
            and self.transport is not None
            and not self.transport.is_closing()
        ):
            self.paused = False
            if self.started:  # the time it was not read is the service's, not the client's
                self.started = self.server.loop.time()
            self.transport.resume_reading()

    def _count_head(self, size: int) -> None:
        """The parsed parts of the head (request target, headers) as they are handed over."""
        self.head_size += size
        if self.head_size > MAX_HEAD:
            self._refuse(431, b"the request's head is over 16 KiB")
            raise _Refused

    def _count_raw_head(self, data: bytes) -> None:
        """A read ended inside a head: count the raw bytes the parser holds for it.

        httptools keeps an unfinished header to itself (it hands a header over
        once the next one begins), so an endless one would never reach
        :meth:`_count_head`. A read that began inside the head is head to its
        end; in the read where the head began, the head is what follows the
        read's last blank line (a head has none) and the body of the request
        before it. That is exact unless that body holds a blank line itself:
        then the head is undercounted, in this one read, by at most a body.
        """
        if self.began:
            blank = data.rfind(b"\r\n\r\n")
            after = len(data) - (blank + 4 if blank >= 0 else 0)
            self.head_raw = max(0, after - self.body_before)
        else:
            self.head_raw += len(data)
        if self.head_raw > MAX_HEAD:
            self._refuse(431, b"the request's head is over 16 KiB")

    def check(self, now: float) -> None:
        """Close this connection if it is idle, or its request is overdue (408)."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.refused:
            return
        if self.started:
            if not self.paused and now - self.started > REQUEST_S:
                self._refuse(408, b"the request did not arrive within %d s" % REQUEST_S)
                if not self.writable:  # nor does the client read: nothing more to say
                    transport.abort()
        elif not self.queue and now - self.last_active > IDLE_S:
            transport.close()


class _Refused(Exception):
    """Stops the parser from a callback: the request is answered with an error, and closing."""


class Server:
    """Listens on one address and hands every complete request to *handler*.

    With *authorization* (the exact ``Authorization`` header value the job's
    clients send), a request without it is answered 401 when its head is complete.
    """

    def __init__(
        self,
        handler: Handler,
        authorization: bytes | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.handler = handler
        self.authorization = authorization
        self.max_connections = max_connections
        self.loop = asyncio.get_running_loop()
        self.connections: set[Connection] = set()
        self.admitted = 0  # connections served (not refused for the cap)
        self.server: asyncio.Server | None = None
        self._date = b""
        self._date_at = -1
        self._check: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, backlog: int = 4096) -> int:
        """Listen; return the port (the one the system chose for port 0)."""
        self.server = await self.loop.create_server(
            lambda: Connection(self), host, port, backlog=backlog, reuse_address=True
        )
        self._check = self.loop.call_later(CHECK_S, self._check_connections)
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

    def _check_connections(self) -> None:
        """Close idle connections (as web servers do) and refuse overdue requests."""
        now = self.loop.time()
        for conn in list(self.connections):
            conn.check(now)
        self._check = self.loop.call_later(CHECK_S, self._check_connections)

    def stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._check is not None:
            self._check.cancel()

    async def close(self) -> None:
        """Stop listening and close every connection (what is answered is written first)."""
        self.stop_listening()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5.0)
