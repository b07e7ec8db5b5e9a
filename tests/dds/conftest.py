"""Fixtures for the data-sharding tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dds_helpers import ServiceProcess

StartService = Callable[..., ServiceProcess]


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[StartService]:
    """A factory: start_service(job, *serve_args, lease_s=..., settings=..., python=...) -> a
    running ServiceProcess (settings: --set assignments; python: what runs ``-m guardctl``)."""
    started: list[ServiceProcess] = []

    def factory(job: str, *args: str, lease_s: float = 2.0, **options: Any) -> ServiceProcess:
        service = ServiceProcess(tmp_path, job, args, lease_s, **options)
        service.start()
        started.append(service)
        return service

    yield factory
    for service in started:
        service.stop()
