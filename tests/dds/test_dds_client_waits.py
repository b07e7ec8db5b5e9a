"""A client kept waiting says on stderr what it waits for: once after notice_s, then every
six times as long, never silently for the whole retry time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from dds_helpers import ServiceProcess

from guardctl.config import load_settings
from guardctl.dds import Client
from guardctl.dds.client import ServiceUnavailable


def notices(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("guardctl: ")]


def test_a_client_without_a_service_says_what_it_waits_for(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(
        assignments=(f"store.root={tmp_path}", "dds.discover_timeout_s=2.4"), environ={}
    )
    client = Client("9401", worker="w", settings=settings, notice_s=0.3)
    with pytest.raises(ServiceUnavailable, match="is `guardctl dds serve` running for this job"):
        client.lease()
    said = notices(capfd.readouterr().err)
    assert len(said) == 2, said  # at 0.3 s and 2.1 s; the wait ends at 2.4 s
    assert said[0].startswith("guardctl: job 9401 has no data-sharding service yet: waiting for")
    assert said[0].endswith("up to 2 s (waiting for 0 s)") and "(waiting for 2 s)" in said[1]


def test_a_client_whose_service_stopped_answering_says_so(
    start_service: Callable[..., ServiceProcess], capfd: pytest.CaptureFixture[str]
) -> None:
    service = start_service("9402", "--records", "100", "--shard-size", "10")
    settings = load_settings(assignments=(f"store.root={service.store}",), environ={})
    client = Client(service.job, worker="w", settings=settings, retry_s=4.0, notice_s=0.2)
    assert client.lease() is not None
    assert notices(capfd.readouterr().err) == []  # an answered request says nothing
    service.kill()
    with pytest.raises(ServiceUnavailable, match="did not answer for 4 s"):
        client.lease()
    said = notices(capfd.readouterr().err)
    assert 2 <= len(said) <= 3, said  # every 1.2 s from 0.2 s, as the backoff's sleeps allow
    host, port, _ = service.address()  # type: ignore[misc]
    assert said[0].startswith(f"guardctl: the data-sharding service of job 9402 at {host}:{port}")
    assert "does not answer" in said[0] and "retrying up to 4 s" in said[0]
