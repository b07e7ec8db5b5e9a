"""The service's HTTP layer (httptools under an asyncio protocol), on real sockets.

A handler here answers some paths at once and others later, as the service
does when an answer waits for its group commit, so that what HTTP/1.1 asks of
a server can be checked directly: answers in request order on a connection,
keep-alive and ``Connection: close``, limits, malformed input, idle connections.
"""

from __future__ import annotations

import asyncio
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
        reply = json.dumps({"path": request.path.decode(), "body": len(request.body),
                            "too_large": request.too_large}).encode()  # fmt: skip
        if request.path.startswith(b"/later/"):
            delay = int(request.path.rsplit(b"/", 1)[1]) / 1000
            asyncio.get_running_loop().call_later(delay, request.answer, 200, reply)
        elif request.path == b"/boom":
            raise RuntimeError("a bug in a handler")
        else:
            request.answer(200 if request.path == b"/now" else 404, reply)


@asynccontextmanager
async def _serving(handler: Callable[[Request], None]) -> AsyncIterator[tuple[Server, int]]:
    server = Server(handler)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.close()


Body = Callable[[Server, int, _Recorder], Coroutine[Any, Any, None]]


def _run(body: Body) -> None:
    """Run *body* against a server answering with a fresh recorder."""

    async def main() -> None:
        recorder = _Recorder()
        async with _serving(recorder) as (server, port):
            await body(server, port, recorder)

    asyncio.run(main())


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _read_answers(reader: asyncio.StreamReader, count: int) -> list[tuple[int, dict, bytes]]:
    answers = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))  # fmt: skip
        body = await reader.readexactly(length)
        answers.append((int(head[9:12]), json.loads(body), head))
    return answers


def _request(path: str, body: bytes = b"", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Authorization: Bearer k\r\n{extra}\r\n").encode() + body  # fmt: skip


def test_pipelined_answers_go_out_in_request_order() -> None:
    """Answers given out of order (a later request answered first, as when one waits for a
    commit and the next does not) are written in the order the requests came."""

    async def test(_server: Server, port: int, recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(_request("/later/200") + _request("/now", b"{}")
                     + _request("/later/50") + _request("/now"))  # fmt: skip
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


def test_a_body_over_the_limit_is_read_through_and_flagged() -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(_request("/now", b"x" * (http_server.MAX_BODY + 1)) + _request("/now"))
        (_, big, _), (_, after, _) = await _read_answers(reader, 2)
        assert big == {"path": "/now", "body": 0, "too_large": True}
        assert after["too_large"] is False  # the connection goes on
        writer.close()

    _run(test)


def test_chunked_bodies_and_expect_continue() -> None:
    async def test(_server: Server, port: int, _recorder: _Recorder) -> None:
        reader, writer = await _open(port)
        writer.write(b"POST /now HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
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
