"""The service's HTTP layer (httptools under an asyncio protocol), on real sockets.

A handler here answers some paths at once and others later, as the service
does when an answer waits for its group commit, so that what HTTP/1.1 asks of
a server can be checked directly: answers in request order on a connection,
keep-alive and ``Connection: close``, limits, malformed input, idle connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest

from guardctl.dds import http_server
from guardctl.dds.http_server import Request, Server


class _Recorder:
    """Answers /now at once and /later/<ms> after that many milliseconds, echoing the request."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, bytes, bytes, int]] = []

    def __call__(self, request: Request) -> None:
        self.seen.append((request.method, request.path, request.authorization, len(request.body)))
        reply = json.dumps({"path": request.path.decode(), "body": len(request.body)}).encode()
        if request.path.startswith(b"/later/"):
            delay = int(request.path.rsplit(b"/", 1)[1]) / 1000
            asyncio.get_running_loop().call_later(delay, request.answer, 200, reply)
        elif request.path == b"/boom":
            raise RuntimeError("a bug in a handler")
        else:
            request.answer(200 if request.path == b"/now" else 404, reply)


@asynccontextmanager
async def _serving(
    handler: Callable[[Request], None], **options: Any
) -> AsyncIterator[tuple[Server, int]]:
    server = Server(handler, **options)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.close()


Body = Callable[[Server, int, _Recorder], Coroutine[Any, Any, None]]


def _run(body: Body, **options: Any) -> None:
    """Run *body* against a server (made with *options*) answering with a fresh recorder."""

    async def main() -> None:
        recorder = _Recorder()
        async with _serving(recorder, **options) as (server, port):
            await asyncio.wait_for(body(server, port, recorder), 20)

    asyncio.run(main())


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    """True once the server has closed the connection: an end of file, or, when the client was
    still writing into it, the broken pipe or reset that its own writes met."""
    try:
        return await asyncio.wait_for(reader.read(), timeout) == b""
    except (BrokenPipeError, ConnectionResetError):
        return True


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _read_answers(reader: asyncio.StreamReader, count: int) -> list[tuple[int, dict, bytes]]:
    answers = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        answers.append((int(head[9:12]), json.loads(body), head))
    return answers


def _request(path: str, body: bytes = b"", extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Authorization: Bearer k\r\n{extra}\r\n"
    ).encode() + body


def test_pipelined_answers_go_out_in_request_order() -> None:
    """Answers given out of order (a later request answered first, as when one waits for a
    commit and the next does not) are written in the order the requests came."""

    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(
            _request("/later/200")
            + _request("/now", b"{}")
            + _request("/later/50")
            + _request("/now")
        )
        answers = await _read_answers(reader, 4)
        assert [a[1]["path"] for a in answers] == ["/later/200", "/now", "/later/50", "/now"]
        assert [seen[2] for seen in recorder.seen] == [b"Bearer k"] * 4
        writer.close()

    _run(test)


def test_keep_alive_and_connection_close_with_a_stock_client() -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:

        def client() -> list[tuple[int, str | None]]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            got = []
            for path in ("/now", "/later/10", "/now?x=1"):
                conn.request("POST", path, body=b'{"a": 1}')
                response = conn.getresponse()
                assert json.loads(response.read())["path"] == path.split("?")[0]
                got.append((response.status, response.getheader("Connection")))
            conn.request("GET", "/now", headers={"Connection": "close"})
            response = conn.getresponse()
            response.read()
            got.append((response.status, response.getheader("Connection")))
            conn.close()
            return got

        got = await asyncio.get_running_loop().run_in_executor(None, client)
        assert got == [(200, None), (200, None), (200, None), (200, "close")]

    _run(test)


def test_a_body_over_the_limit_is_refused_from_its_length_before_it_is_read() -> None:
    """413 as soon as the head declares too long a body: none of it has been sent yet."""

    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(
            _request("/later/100") + b"POST /now HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n" % (http_server.MAX_BODY + 1)
        )
        first, refused = await _read_answers(reader, 2)  # the one before it first
        assert first[0] == 200 and refused[0] == 413 and b"Connection: close" in refused[2]
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert [seen[1] for seen in recorder.seen] == [b"/later/100"]
        writer.close()

    _run(test)


def test_a_chunked_body_is_refused_as_it_passes_the_limit() -> None:
    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(b"POST /now HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 8192
        for _ in range(http_server.MAX_BODY // len(chunk) + 1):  # never the last chunk
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        [(status, _, _)] = await _read_answers(reader, 1)
        assert status == 413 and not recorder.seen
        writer.close()

    _run(test)


def test_chunked_bodies_and_expect_continue() -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(
            b"POST /now HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        writer.write(b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
        [(status, answer, _)] = await _read_answers(reader, 1)
        assert status == 200 and answer["body"] == 7
        writer.close()

    _run(test)


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST /now HTTP/1.1\r\nContent-Length: nope\r\n\r\n", 400),
        (b"GET /now HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", 400),
        (b"GET /now HTTP/1.1\r\nX-Big: " + b"a" * (http_server.MAX_HEAD + 1) + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * (http_server.MAX_HEAD + 1) + b" HTTP/1.1\r\n\r\n", 431),
    ],
    ids=["garbage", "bad length", "upgrade", "big header", "big url"],
)
def test_malformed_input_is_answered_and_closed_and_the_server_carries_on(
    sent: bytes, status: int
) -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(_request("/later/50") + sent)  # a request before it is answered first
        answers = await _read_answers(reader, 2)
        assert answers[0][0] == 200 and answers[1][0] == status
        assert b"Connection: close" in answers[1][2] and answers[1][1]["error"]
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
        reader, writer = await _open(port)
        writer.write(_request("/now"))
        assert (await _read_answers(reader, 1))[0][0] == 200
        writer.close()

    _run(test)


def test_a_failing_handler_gets_500_and_the_connection_goes_on() -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(_request("/boom") + _request("/now"))
        answers = await _read_answers(reader, 2)
        assert [a[0] for a in answers] == [500, 200]
        writer.close()

    _run(test)


def test_an_answer_after_the_client_left_is_dropped() -> None:
    async def test(server: Server, port: int, _recorder: _Recorder) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(_request("/later/100"))
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the answer comes after connection_lost: nothing breaks
        assert not server.connections
        reader, writer = await _open(port)
        writer.write(_request("/now"))
        assert (await _read_answers(reader, 1))[0][0] == 200
        writer.close()

    _run(test)


def test_idle_connections_are_closed_busy_ones_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "IDLE_S", 0.5)

    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        idle_reader, _ = await _open(port)
        busy_reader, busy = await _open(port)
        busy.write(_request("/later/900"))  # in progress longer than IDLE_S
        assert await asyncio.wait_for(idle_reader.read(), 3) == b""
        [(status, _, _)] = await _read_answers(busy_reader, 1)
        assert status == 200
        busy.close()

    _run(test)


def test_a_client_that_does_not_read_stops_being_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined requests past MAX_PIPELINED unanswered stop the reading of that connection
    (not the server); it resumes as answers go out."""
    monkeypatch.setattr(http_server, "MAX_PIPELINED", 4)

    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(b"".join(_request("/later/300") for _ in range(4)))
        await asyncio.sleep(0.1)
        writer.write(b"".join(_request("/later/10") for _ in range(8)))
        await asyncio.sleep(0.1)
        assert len(recorder.seen) == 4  # reading paused with four answers outstanding
        answers = await _read_answers(reader, 12)
        assert len(recorder.seen) == 12 and all(a[0] == 200 for a in answers)
        writer.close()

    _run(test)


def test_a_head_request_gets_the_head_only() -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:

        def client() -> tuple[int, bytes, str | None, int]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("HEAD", "/now")
            head = conn.getresponse()
            body = head.read()
            conn.request("GET", "/now")  # the same connection: nothing left over to misread
            after = conn.getresponse()
            after.read()
            conn.close()
            return head.status, body, head.getheader("Content-Length"), after.status

        status, body, length, after = await asyncio.get_running_loop().run_in_executor(None, client)
        assert (status, body, after) == (200, b"", 200) and int(length or 0) > 0

    _run(test)


def test_the_secret_is_checked_when_the_head_is_complete() -> None:
    """401 before any of the body is read (or sent); the body is then dropped, not kept, no
    handler runs, and the connection goes on."""

    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(
            b"POST /now HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guess\r\n"
            b"Content-Length: 60000\r\n\r\n"
        )
        [(status, answer, _)] = await _read_answers(reader, 1)  # no byte of the body sent
        assert status == 401 and answer["error"]
        writer.write(b"x" * 60000 + _request("/now", b"{}"))  # with the secret (Bearer k)
        [(status, answer, _)] = await _read_answers(reader, 1)
        assert status == 200 and answer["body"] == 2
        assert [seen[1] for seen in recorder.seen] == [b"/now"]
        writer.close()

    _run(test, authorization=b"Bearer k")


@pytest.mark.parametrize("pieces", [1, 8], ids=["one read", "eight reads"])
def test_an_unterminated_head_is_refused_by_its_raw_size(pieces: int) -> None:
    """A header that never ends is kept by the parser, not handed over: its raw bytes count."""

    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        head = b"GET /now HTTP/1.1\r\nX-Endless: " + b"a" * (2 * http_server.MAX_HEAD)
        size = len(head) // pieces + 1
        for at in range(0, len(head), size):
            writer.write(head[at : at + size])
            await asyncio.sleep(0.02)
        [(status, _, _)] = await _read_answers(reader, 1)
        assert status == 431 and not recorder.seen
        writer.close()

    _run(test)


def test_a_head_split_across_reads_after_a_pipelined_body_is_not_refused() -> None:
    """The raw count is not fooled by what came before a head in the same read."""

    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        big = b"GET /now HTTP/1.1\r\nX-Big: " + b"a" * (http_server.MAX_HEAD * 3 // 4)
        writer.write(_request("/now", b"x" * 20000) + big)
        await asyncio.sleep(0.1)
        writer.write(b"\r\n\r\n")
        answers = await _read_answers(reader, 2)
        assert [a[0] for a in answers] == [200, 200] and len(recorder.seen) == 2
        writer.close()

    _run(test)


def test_a_trickling_request_gets_408_and_trickling_blank_lines_count_as_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slowloris: a byte now and then extends neither the request's deadline nor the idle clock."""
    monkeypatch.setattr(http_server, "REQUEST_S", 0.5, raising=False)
    monkeypatch.setattr(http_server, "IDLE_S", 0.5)
    monkeypatch.setattr(http_server, "CHECK_S", 0.1, raising=False)

    async def trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
        with contextlib.suppress(ConnectionError):
            for byte in data:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.05)

    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        blank_reader, blank_writer = await _open(port)
        # Each would go on trickling for 10 s: far past both limits (0.5 s).
        slow = asyncio.ensure_future(trickle(writer, b"GET /now HTTP/1.1\r\nX-Slow: " + b"a" * 200))
        blanks = asyncio.ensure_future(trickle(blank_writer, b"\r\n" * 100))
        [(status, _, head)] = await _read_answers(reader, 1)
        assert status == 408 and b"Connection: close" in head
        assert await _closed_by_server(blank_reader, 2)  # closed as idle
        assert not slow.done() and not blanks.done()  # both closed while still trickling
        slow.cancel()
        blanks.cancel()
        writer.close()
        blank_writer.close()

    _run(test)


def test_connections_over_the_cap_get_503_and_a_freed_place_is_taken() -> None:
    async def test(server: Server, port: int, _recorder: _Recorder) -> None:
        held = []
        for _ in range(3):
            reader, writer = await _open(port)
            writer.write(_request("/now"))
            assert (await _read_answers(reader, 1))[0][0] == 200
            held.append((reader, writer))
        reader, writer = await _open(port)
        [(status, answer, head)] = await _read_answers(reader, 1)
        assert status == 503 and b"Connection: close" in head and "connections" in answer["error"]
        assert await asyncio.wait_for(reader.read(), 5) == b""
        held.pop()[1].close()
        for _ in range(100):  # until the server has seen it go
            if server.admitted < 3:
                break
            await asyncio.sleep(0.02)
        reader, writer = await _open(port)
        writer.write(_request("/now"))
        assert (await _read_answers(reader, 1))[0][0] == 200
        for _, held_writer in held:
            held_writer.close()
        writer.close()

    _run(test, max_connections=3)


def test_100_continue_comes_after_the_answers_to_earlier_requests() -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(
            _request("/later/200") + b"POST /now HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        )
        [(status, answer, _)] = await _read_answers(reader, 1)
        assert status == 200 and answer["path"] == "/later/200"
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        writer.write(b"{}")
        [(status, answer, _)] = await _read_answers(reader, 1)
        assert status == 200 and answer["body"] == 2
        writer.close()

    _run(test)


def test_a_half_closed_connection_gets_its_answers_then_is_closed() -> None:
    """A client that shuts its sending side after its requests still reads every answer."""

    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(_request("/later/150") + _request("/now") + _request("/later/50"))
        writer.write_eof()
        answers = await _read_answers(reader, 3)
        assert [a[1]["path"] for a in answers] == ["/later/150", "/now", "/later/50"]
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()

    _run(test)
