"""The service's commit process: answers only after the commit, and it dies with the service."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable

import psutil
from dds_helpers import ServiceProcess


def _leaser(
    service: ServiceProcess, name: str, told: list[tuple[str, int]], stop: threading.Event
) -> None:
    """Lease as fast as one connection allows; remember every answer the service gave."""
    host, port, _ = service.address()  # type: ignore[misc]
    secret = (service.dir / "secret").read_text().strip()
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection(host, port, timeout=5)
    n = 0
    while not stop.is_set():
        request_id = f"{name}-{n}"
        n += 1
        try:
            body = json.dumps({"worker": name, "request_id": request_id})
            conn.request("POST", "/v1/lease", body, headers)
            reply = json.loads(conn.getresponse().read())
        except (OSError, http.client.HTTPException, ValueError):
            return  # the service was killed: whatever it did not answer does not count
        if reply.get("status") == "leased":
            told.append((request_id, int(reply["lease"])))


def test_every_answered_lease_is_in_the_database_after_a_sigkill(
    start_service: Callable[..., ServiceProcess],
) -> None:
    service = start_service("7001", "--records", "2000000", "--shard-size", "10", lease_s=600.0)
    told: list[tuple[str, int]] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=_leaser, args=(service, f"w{i}", told, stop)) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    service.kill()  # mid-stream: batches are in flight in the commit process
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    assert len(told) > 100, "too few leases to say anything"
    with service.db() as conn:
        stored = dict(conn.execute("SELECT request_id, lease_id FROM lease").fetchall())
    missing = [(r, lease) for r, lease in told if stored.get(r) != lease]
    assert not missing, f"answered but not durable: {missing[:5]}"


def test_the_commit_process_dies_with_the_service_and_a_restart_follows(
    start_service: Callable[..., ServiceProcess],
) -> None:
    service = start_service("7002", "--records", "1000", "--shard-size", "10")
    assert service.proc is not None
    helpers = psutil.Process(service.proc.pid).children(recursive=True)
    assert len(helpers) == 1, "the service should run exactly one commit process"
    service.kill()
    _gone, alive = psutil.wait_procs(helpers, timeout=5)
    assert not alive, "the commit process outlived the service"
    service.start(with_dataset=False)  # takes the lock the commit process held: it is free
    assert service.proc.poll() is None
    service.stop()
    assert service.proc.wait(timeout=10) == 0
