"""Only the job may talk to its service; malformed requests get an error, not a crash."""

from __future__ import annotations

import http.client
import json
import stat
from collections.abc import Callable

import pytest
from dds_helpers import ServiceProcess

from guardctl.config import load_settings
from guardctl.dds import Client, NotAuthorised, RequestRejected


def _post(
    service: ServiceProcess, path: str, body: bytes, secret: str | None
) -> tuple[int, dict[str, object]]:
    host, port, _ = service.address()  # type: ignore[misc]
    conn = http.client.HTTPConnection(host, port, timeout=5)
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    try:
        return response.status, json.loads(payload)
    except ValueError:
        return response.status, {"text": payload.decode(errors="replace")}


def test_the_secret_is_private_and_required(start_service: Callable[..., ServiceProcess]) -> None:
    service = start_service("5001", "--records", "100", "--shard-size", "10")
    secret_file = service.dir / "secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(service.dir.stat().st_mode) == 0o700
    lease = json.dumps({"worker": "w", "request_id": "r1"}).encode()
    assert _post(service, "/v1/lease", lease, None)[0] == 401
    assert _post(service, "/v1/lease", lease, "guessed")[0] == 401
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    with pytest.raises(NotAuthorised):
        Client(service.job, secret="guessed", settings=settings, retry_s=2).lease()
    secret = secret_file.read_text().strip()
    assert _post(service, "/v1/lease", lease, secret)[1]["status"] == "leased"


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/lease", b"{not json", 400),
        ("/v1/lease", b"[1, 2]", 400),
        ("/v1/lease", b"\xff\xfe", 400),
        ("/v1/lease", b'{"worker": "w"}', 400),
        ("/v1/lease", b'{"worker": 5, "request_id": "x"}', 400),
        ("/v1/lease", b'{"worker": "", "request_id": "x"}', 400),
        ("/v1/ack", b'{"lease": "7"}', 400),
        ("/v1/ack", b'{"lease": true}', 400),
        ("/v1/ack", b'{"lease": 123456}', 409),
        ("/v1/ack", b'{"lease": 123456, "next": 5}', 400),
        ("/v1/ack", b'{"lease": 123456, "next": {"worker": "w"}}', 400),
        ("/v1/step", b'{"worker": "w", "rank": 5, "world": 2, "step": 0}', 409),
        ("/v1/step", b'{"worker": "w", "rank": 0, "world": 0, "step": 0}', 400),
        ("/v1/restore", b'{"checkpoint": "nope", "request_id": "r"}', 409),
        ("/v1/lease", b"x" * 100_000, 413),
        ("/v1/nothing", b"{}", 404),
    ],
    ids=lambda v: v.decode(errors="replace")[:24] if isinstance(v, bytes) else str(v),
)
def test_malformed_requests_get_an_error_and_the_service_carries_on(
    start_service: Callable[..., ServiceProcess], path: str, body: bytes, status: int
) -> None:
    service = start_service("5002", "--records", "100", "--shard-size", "10", "--global-batch", "8")
    secret = (service.dir / "secret").read_text().strip()
    got, reply = _post(service, path, body, secret)
    assert got == status
    if status != 404 and status != 413:
        assert isinstance(reply.get("error"), str) and reply["error"]
    step = b'{"worker": "w", "rank": 0, "world": 1, "step": 0}'  # the job is per step
    ok, reply = _post(service, "/v1/step", step, secret)
    assert ok == 200 and reply["status"] == "ok"
    assert service.proc is not None and service.proc.poll() is None


def test_client_surfaces_a_rejected_request(start_service: Callable[..., ServiceProcess]) -> None:
    service = start_service("5003", "--records", "100", "--shard-size", "10")
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    client = Client(service.job, worker="w", settings=settings)
    with pytest.raises(RequestRejected, match="unknown checkpoint"):
        client.restore("never-committed")
