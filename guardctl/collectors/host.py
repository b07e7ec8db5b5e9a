"""The ``host`` collector: CPU use, load and memory through psutil."""

from __future__ import annotations

import os

import psutil

from guardctl.collectors import Record, register
from guardctl.sections.agent import AgentSettings
from guardctl.telemetry.schema import make_record


class HostCollector:
    """One ``host`` record per sample."""

    name = "host"

    def __init__(self) -> None:
        self._primed = False

    def _cpu_pct(self) -> float:
        # cpu_percent(None) measures since the previous call; the first call has
        # none, so it measures over a short interval instead of answering 0.0.
        if not self._primed:
            self._primed = True
            return float(psutil.cpu_percent(interval=0.1))
        return float(psutil.cpu_percent(interval=None))

    def collect(self, node: str, ts: float) -> list[Record]:
        return [
            make_record(
                "host",
                node,
                ts,
                cpu_pct=self._cpu_pct(),
                load1=float(os.getloadavg()[0]),
                mem_used_pct=float(psutil.virtual_memory().percent),
            )
        ]

    def close(self) -> None:
        pass


def _factory(settings: AgentSettings) -> HostCollector:
    return HostCollector()


register("host", _factory)
