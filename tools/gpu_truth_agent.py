#!/usr/bin/env python3
"""Check the agent's GPU readings against nvidia-smi on a real GPU node.

Runs ``guardctl agent`` for a while (60 s by default) into a temporary store
and, side by side, polls::

    nvidia-smi --query-gpu=index,clocks.sm,power.draw,power.limit,temperature.gpu,
               utilization.gpu,clocks_event_reasons.active --format=csv,noheader,nounits

every second. Each nvidia-smi row is paired with the agent's record of the
same GPU nearest in time (within 1.5 s); a field passes when at least 90% of
its pairs agree within its tolerance (clock reasons: 80%, they flip fast).
Prints a table, the agent's CPU and memory use over the run, and exits 0 when
all fields agree, 1 on a mismatch, 2 when it cannot run (no GPU, no records).

    python tools/gpu_truth_agent.py [--seconds 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guardctl import runner
from guardctl.telemetry.schema import read_path

QUERY = (
    "index,clocks.sm,power.draw,power.limit,temperature.gpu,utilization.gpu,"
    "clocks_event_reasons.active"
)
PAIR_WINDOW_S = 1.5


@dataclass(frozen=True)
class Field:
    """One compared reading: the agent's field, the nvidia-smi column, the tolerance."""

    agent: str
    column: int
    agrees: Callable[[float, float], bool]
    pass_fraction: float = 0.9


def _within(abs_tol: float, rel_tol: float = 0.0) -> Callable[[float, float], bool]:
    return lambda a, b: abs(a - b) <= max(abs_tol, rel_tol * max(abs(a), abs(b)))


FIELDS = [
    Field("sm_clock_mhz", 1, _within(30.0, 0.05)),
    # Both average over about a second, but not the same second.
    Field("power_w", 2, _within(20.0, 0.10)),
    Field("power_limit_w", 3, _within(1.0)),
    Field("temp_c", 4, _within(3.0)),
    Field("util_pct", 5, _within(15.0)),
    Field("clock_event_reasons", 6, lambda a, b: int(a) == int(b), 0.8),
]


def parse_smi(text: str, ts: float) -> list[tuple[float, int, list[float | None]]]:
    """nvidia-smi CSV rows -> (ts, gpu index, values by column); "[N/A]" becomes None."""
    rows = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 7 or not cells[0].isdigit():
            continue
        values: list[float | None] = []
        for i, cell in enumerate(cells):
            try:
                values.append(float(int(cell, 16)) if i == 6 else float(cell))
            except ValueError:
                values.append(None)  # [N/A], [Not Supported]
        rows.append((ts, int(cells[0]), values))
    return rows


def pair(
    smi: list[tuple[float, int, list[float | None]]], records: list[dict[str, Any]]
) -> list[tuple[dict[str, Any], list[float | None]]]:
    """Each nvidia-smi row with the agent record of its GPU nearest in time."""
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        if record["kind"] == "gpu":
            by_gpu.setdefault(record["gpu"], []).append(record)
    pairs = []
    for ts, gpu, values in smi:
        candidates = by_gpu.get(gpu, [])
        if not candidates:
            continue
        nearest = min(candidates, key=lambda r: abs(r["ts"] - ts))
        if abs(nearest["ts"] - ts) <= PAIR_WINDOW_S:
            pairs.append((nearest, values))
    return pairs


def compare(pairs: list[tuple[dict[str, Any], list[float | None]]]) -> list[dict[str, Any]]:
    """One row per GPU and field: pairs compared, agreement, medians, pass or fail."""
    rows = []
    gpus = sorted({record["gpu"] for record, _ in pairs})
    for gpu in gpus:
        for field in FIELDS:
            both = [
                (float(r[field.agent]), v[field.column])
                for r, v in pairs
                if r["gpu"] == gpu
                and r.get(field.agent) is not None
                and v[field.column] is not None
            ]
            if not both:
                rows.append(
                    {
                        "gpu": gpu,
                        "field": field.agent,
                        "pairs": 0,
                        "agree": None,
                        "agent": None,
                        "smi": None,
                        "ok": True,
                        "note": "not reported",
                    }
                )
                continue
            agree = sum(field.agrees(a, s) for a, s in both) / len(both)  # type: ignore[arg-type]
            rows.append(
                {
                    "gpu": gpu,
                    "field": field.agent,
                    "pairs": len(both),
                    "agree": agree,
                    "agent": statistics.median(a for a, _ in both),
                    "smi": statistics.median(s for _, s in both if s is not None),
                    "ok": agree >= field.pass_fraction,
                    "note": "",
                }
            )
    return rows


def _agent_usage(pid: int) -> dict[str, float]:
    import psutil

    proc = psutil.Process(pid)
    cpu = proc.cpu_times()
    return {"cpu_s": cpu.user + cpu.system, "rss_mib": proc.memory_info().rss / 2**20}


def run(seconds: float) -> tuple[list[dict[str, Any]], dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        agent = runner.spawn(
            [
                sys.executable,
                "-m",
                "guardctl",
                "--set",
                'agent.status_file=""',
                "agent",
                "--store",
                str(store),
                "--interval",
                "1",
                "--node",
                "truth",
            ],
            stdout_path=str(Path(tmp) / "agent.log"),
        )
        smi: list[tuple[float, int, list[float | None]]] = []
        started = time.monotonic()
        usage: dict[str, float] = {}
        try:
            while time.monotonic() - started < seconds:
                ts = time.time()
                out = runner.run(
                    ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                    timeout=10,
                ).stdout
                smi.extend(parse_smi(out, (ts + time.time()) / 2))
                time.sleep(max(0.0, 1.0 - (time.time() - ts)))
            usage = _agent_usage(agent.pid)
        finally:
            runner.stop(agent)
        usage["cpu_pct_of_core"] = 100 * usage.get("cpu_s", 0.0) / seconds
        records = read_path(store).records if store.exists() else []
        log = (Path(tmp) / "agent.log").read_text(errors="replace")
    if not records:
        print(f"gpu_truth_agent: the agent wrote no records; its log:\n{log}", file=sys.stderr)
    return compare(pair(smi, records)), usage


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print(
            "gpu_truth_agent: nvidia-smi not found: run this on a node with NVIDIA GPUs",
            file=sys.stderr,
        )
        return 2
    rows, usage = run(args.seconds)
    if not rows:
        print("gpu_truth_agent: nothing to compare (no GPU records paired)", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rows": rows, "agent": usage}, indent=2))
    else:
        from tabulate import tabulate

        print(
            tabulate(
                [
                    [
                        r["gpu"],
                        r["field"],
                        r["pairs"],
                        "-" if r["agree"] is None else f"{100 * r['agree']:.0f}%",
                        r["agent"],
                        r["smi"],
                        "ok" if r["ok"] else "MISMATCH",
                    ]
                    for r in rows
                ],
                headers=[
                    "gpu",
                    "field",
                    "pairs",
                    "agree",
                    "agent (median)",
                    "nvidia-smi (median)",
                    "",
                ],
            )
        )
        print(
            f"agent over {args.seconds:g} s: {usage['cpu_pct_of_core']:.2f}% of one core, "
            f"{usage.get('rss_mib', 0):.1f} MiB resident"
        )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
