"""tools/gpu_truth_agent.py's comparison, on nvidia-smi rows and the agent's own records."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest
from agent_helpers import FakeNvml
from agent_helpers import load_tool as load

from guardctl.collectors.nvml import NvmlCollector


def load_tool() -> ModuleType:
    return load("gpu_truth_agent")


# What `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` prints for two H200s.
SMI = """\
0, 1980, 651.87, 700.00, 58, 100, 0x0000000000000000
5, 1275, 497.40, 700.00, 87, 100, 0x0000000000000048
"""


def agent_records(fake: FakeNvml, ts: float) -> list[dict[str, object]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "pynvml", fake.module())
        return NvmlCollector().collect("truth", ts)


def test_agreeing_readings_pass() -> None:
    tool = load_tool()
    records = agent_records(FakeNvml(), 1000.0) + agent_records(FakeNvml(), 1001.0)
    smi = tool.parse_smi(SMI, 1000.2) + tool.parse_smi(SMI, 1001.3)
    rows = tool.compare(tool.pair(smi, records))
    assert {(r["gpu"], r["field"]) for r in rows} == {
        (g, f.agent) for g in (0, 5) for f in tool.FIELDS
    }
    assert all(r["ok"] and r["pairs"] == 2 for r in rows), rows


def test_a_wrong_clock_is_a_mismatch() -> None:
    tool = load_tool()
    fake = FakeNvml()
    fake.gpus[5]["sm_clock_mhz"] = 1980  # the agent would say full clock; nvidia-smi says 1275
    rows = tool.compare(tool.pair(tool.parse_smi(SMI, 50.0), agent_records(fake, 50.5)))
    bad = [(r["gpu"], r["field"]) for r in rows if not r["ok"]]
    assert bad == [(5, "sm_clock_mhz")]


def test_rows_too_far_apart_are_not_paired() -> None:
    tool = load_tool()
    assert tool.pair(tool.parse_smi(SMI, 10.0), agent_records(FakeNvml(), 20.0)) == []


def test_not_available_cells() -> None:
    tool = load_tool()
    rows = tool.parse_smi("0, 1410, [N/A], 300.00, 40, 0, 0x0000000000000001\nheader\n", 1.0)
    assert rows == [(1.0, 0, [0.0, 1410.0, None, 300.0, 40.0, 0.0, 1.0])]
