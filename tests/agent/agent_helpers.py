"""Shared helpers of the agent tests: where the recorded trees are, settings for tests."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from guardctl.sections.agent import AgentSettings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SYSFS_IB2 = FIXTURES / "sysfs" / "ib2"  # mlx5_0 healthy, mlx5_1 downshifted and flapping
SYSFS_IB8 = FIXTURES / "sysfs" / "ib8"  # eight healthy NDR ports

if str(FIXTURES / "nvml") not in sys.path:
    sys.path.insert(0, str(FIXTURES / "nvml"))
from fake_pynvml import FakeNvml  # noqa: E402

__all__ = ["FIXTURES", "SYSFS_IB2", "SYSFS_IB8", "Disk", "FakeNvml", "load_tool", "settings"]

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py as a module (the GPU truth checks are scripts, not part of the package)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def settings(**changes: object) -> AgentSettings:
    """Agent settings for tests: recorded IB tree, no status file unless asked."""
    base = AgentSettings(
        interval_s=1.0, sysfs_root=str(SYSFS_IB2), status_file="", collector_timeout_s=2.0
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


class Disk:
    """The write boundary: real os.write, unless told to fail or to write short."""

    def __init__(self) -> None:
        self.error: int | None = None
        self.short = False
        self.calls = 0

    def write(self, fd: int, data: bytes) -> int:
        self.calls += 1
        if self.error is not None:
            raise OSError(self.error, os.strerror(self.error))
        if self.short:
            # what a nearly full disk does: part of the buffer lands, then it stops
            return os.write(fd, data[: len(data) // 2])
        return os.write(fd, data)
