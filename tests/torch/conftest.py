"""Fixtures for the torch integration tests: the data-sharding tests' real service process."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dds"))
from dds_helpers import ServiceProcess


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """A factory: service(job, *serve_args, lease_s=...) -> a running ServiceProcess."""
    started: list[ServiceProcess] = []

    def factory(job: str, *args: str, lease_s: float = 2.0) -> ServiceProcess:
        proc = ServiceProcess(tmp_path, job, args, lease_s)
        proc.start()
        started.append(proc)
        return proc

    yield factory
    for proc in started:
        proc.stop()
