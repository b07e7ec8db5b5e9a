"""A real ``guardctl dds serve`` against hostile and mistaken clients, on loopback.

Each test is bounded (a few connections or requests, socket timeouts of a few
seconds): a defence that is missing shows as a timeout or a wrong answer, not
as a test that runs on.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from dds_helpers import ServiceProcess

from guardctl.dds.service import FILES_MARGIN, listen_address

StartService = Callable[..., ServiceProcess]
NO_ORJSON = Path(__file__).with_name("no_orjson.py")


def _connect(service: ServiceProcess) -> socket.socket:
    host, port, _ = service.address()  # type: ignore[misc]
    sock = socket.create_connection((host, port), timeout=5)
    sock.settimeout(5)
    return sock


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """The first answer on *sock*: its status and everything up to the end of its head."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed without an answer: {data!r}"
        data += chunk
    return int(data[9:12]), data


def _post(service: ServiceProcess, path: str, body: bytes) -> tuple[int, dict[str, object]]:
    host, port, _ = service.address()  # type: ignore[misc]
    secret = (service.dir / "secret").read_text().strip()
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("POST", path, body=body, headers={"Authorization": f"Bearer {secret}"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    return response.status, reply


def test_a_client_without_the_secret_is_refused_before_its_body(
    start_service: StartService,
) -> None:
    service = start_service("7001", "--records", "100", "--shard-size", "10")
    with _connect(service) as sock:
        sock.sendall(
            b"POST /v1/lease HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guessed\r\n"
            b"Content-Length: 60000\r\n\r\n"
        )
        assert _answer(sock)[0] == 401  # no byte of the 60000 sent
    with _connect(service) as sock:  # nor does a body the service will not take get read
        sock.sendall(b"POST /v1/lease HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n")
        assert _answer(sock)[0] in (401, 413)


def test_the_connections_are_capped_and_the_open_files_sized_to_the_cap(
    start_service: StartService,
) -> None:
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The common default, which the service used to lift to 65536; never below what this test
    # process already holds open (a long pytest run may hold more than 1024 descriptors).
    inherited = max(min(1024, hard), len(os.listdir("/proc/self/fd")) + 64)
    resource.setrlimit(resource.RLIMIT_NOFILE, (inherited, hard))
    try:
        settings = ["dds.bind=127.0.0.1", "dds.max_connections=2"]
        service = start_service("7002", "--records", "100", "--shard-size", "10", settings=settings)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))
    assert service.proc is not None
    # Raised toward what the cap needs (here less than it has), not further.
    assert psutil.Process(service.proc.pid).rlimit(psutil.RLIMIT_NOFILE) == (
        max(inherited, min(2 + FILES_MARGIN, hard)),
        hard,
    )
    held = [_connect(service) for _ in range(2)]
    for sock in held:  # both served
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(sock)[0] == 401  # (no secret: answered all the same)
    held.append(_connect(service))
    with held[-1] as third:
        status, head = _answer(third)
        assert status == 503 and b"Connection: close" in head
    for sock in held[:2]:
        sock.close()


def test_it_listens_on_the_nodes_own_address_by_default(start_service: StartService) -> None:
    service = start_service("7003", "--records", "100", "--shard-size", "10", settings=[])
    assert service.proc is not None
    own = listen_address("")
    listening = {
        c.laddr.ip
        for c in psutil.Process(service.proc.pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert listening == {own}, "not the node's own address"
    host, _, _ = service.address()  # type: ignore[misc]
    assert host == own
    assert _post(service, "/v1/lease", b'{"worker": "w", "request_id": "r"}')[0] == 200


def test_a_per_step_request_to_a_pull_job_is_a_409_not_a_crash(
    start_service: StartService,
) -> None:
    """Started without --global-batch: the reason comes back, and no traceback anywhere."""
    service = start_service("7004", "--records", "100", "--shard-size", "10")
    status, reply = _post(service, "/v1/step", b'{"worker": "w", "rank": 0, "world": 2, "step": 0}')
    assert status == 409 and "--global-batch" in str(reply["error"])
    assert _post(service, "/v1/lease", b'{"worker": "w", "request_id": "r"}')[0] == 200
    service.stop()
    assert "Traceback" not in service.log_text()
    assert "Traceback" not in (service.dir / "service.log").read_text()


BAD_VALUES = [
    ("/v1/commit", b'{"checkpoint": "c", "step": 9223372036854775808}'),  # 2**63
    ("/v1/renew", b'{"lease": -9223372036854775809}'),
    ("/v1/step", b'{"worker": "w", "rank": 0, "world": 4, "step": 0, "seconds": 1e400}'),
    ("/v1/step", b'{"worker": "w", "rank": 0, "world": 4, "step": 0, "seconds": NaN}'),
    ("/v1/step", b'{"worker": "w", "rank": 0, "world": 10000000, "step": 0}'),
    ("/v1/lease", b'{"worker": "\\ud800", "request_id": "r"}'),  # a lone surrogate
]


@pytest.mark.parametrize("codec", ["orjson", "json"])
def test_values_the_database_cannot_hold_are_400_and_the_service_carries_on(
    start_service: StartService, codec: str
) -> None:
    """Accepted, they would fail the group commit, which stops the service (503), or make a
    split among ten million ranks. With orjson or without (the standard json module lets
    through what orjson refuses: NaN, lone surrogates, infinities)."""
    python = [sys.executable] if codec == "orjson" else [sys.executable, str(NO_ORJSON)]
    service = start_service(
        "7005", "--records", "100", "--shard-size", "10", "--global-batch", "8", python=python
    )
    for path, body in BAD_VALUES:
        status, reply = _post(service, path, body)
        assert (status, path) == (400, path) and reply["error"], body
    assert _post(service, "/v1/commit", b'{"checkpoint": "after", "step": 1}')[0] == 200
    assert service.proc is not None and service.proc.poll() is None
