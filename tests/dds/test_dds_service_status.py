"""GET /v1/status is counted off the event loop: the other requests go on being answered.

Its counts scan the lease table (about 1 s at 1.5 million leases); counted in
the loop, they stopped every request of the job meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from dds_helpers import RawConn, serving

from guardctl.dds import service as service_module


def test_requests_are_answered_while_a_status_report_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting, release = threading.Event(), threading.Event()
    read_status = service_module.read_status

    def slow_read_status(path: Path, job: str) -> dict[str, Any]:
        counting.set()
        release.wait(10)  # held until the lease below is answered (or, in the loop, for 10 s)
        return read_status(path, job)

    monkeypatch.setattr(service_module, "read_status", slow_read_status)

    async def body() -> None:
        async with serving(tmp_path) as port:
            operator = RawConn(*await asyncio.open_connection("127.0.0.1", port))
            rank = RawConn(*await asyncio.open_connection("127.0.0.1", port))
            report = asyncio.create_task(operator.request("GET", "/v1/status"))
            await asyncio.to_thread(counting.wait, 10)
            lease = await rank.post("/v1/lease", {"worker": "w", "request_id": "r1"})
            assert lease["status"] == "leased"
            assert not report.done()
            release.set()
            answer = await asyncio.wait_for(report, 10)
            assert answer["http_status"] == 200 and answer["leases"]["in_flight"] == 1
            for conn in (operator, rank):
                conn.writer.close()

    asyncio.run(body())
