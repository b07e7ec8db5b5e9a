"""Fixtures for the agent, store and probe tests: a fake NVML at the import boundary."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from agent_helpers import FakeNvml


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """Eight H200s behind a fake ``pynvml`` module, swapped in at the import boundary."""
    fake = FakeNvml("h200_sxm_8gpu.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    yield fake
