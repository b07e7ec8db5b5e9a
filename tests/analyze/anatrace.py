"""Hand-made schema-v1 traces for the analyzer's tests: a small healthy fleet, edited per case.

One job on ``nodes`` nodes (8 GPUs, 4 NIC ports each) plus optional idle
nodes, sampled every 10 s. Tests change the arrays (from an onset sample on)
and then :meth:`Trace.write` writes real files in the store layout through
``schema.make_record`` / ``schema.dumps``, which the analyzer reads back.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from guardctl.analyze import Analysis, analyze
from guardctl.config import load_settings
from guardctl.storage import layout
from guardctl.telemetry import schema

T0 = 1_764_547_200.0
GPUS = 8
PORTS = 4


class Trace:
    """A healthy fleet over ``minutes``; arrays are (samples, nodes[, GPUs | ports])."""

    def __init__(
        self,
        root: Path,
        nodes: int = 6,
        idle: int = 0,
        minutes: int = 20,
        interval: float = 10.0,
        seed: int = 7,
    ) -> None:
        rng = np.random.default_rng(seed)
        self.root = root
        self.interval = interval
        self.n = nodes + idle
        self.busy = np.array([True] * nodes + [False] * idle)
        self.t = T0 + np.arange(0, minutes * 60, interval)
        T, N = self.t.size, self.n
        shape = (T, N, GPUS)
        b = self.busy[None, :, None]
        self.names = [f"gn{i + 1:02d}" for i in range(N)]
        self.skew = np.zeros(N)
        self.present = np.ones((T, N), bool)
        self.gpu: dict[str, np.ndarray] = {
            "sm_clock_mhz": np.where(b, 1980 - rng.integers(0, 25, shape), 345),
            "power_w": np.where(b, 600 + rng.normal(0, 8, shape), 70 + rng.normal(0, 2, shape)),
            "power_limit_w": np.full(shape, 700.0),
            "temp_c": np.where(b, 65 + rng.normal(0, 1.5, shape), 32 + rng.normal(0, 1, shape)),
            "util_pct": np.where(b, 99, 0),
            "clock_event_reasons": np.where(b, 0, 0x1),
            "ecc_sbe_volatile": np.zeros(shape, np.int64),
            "ecc_dbe_volatile": np.zeros(shape, np.int64),
            "pcie_replay": np.zeros(shape, np.int64),
            "nvlink_crc_errors": np.zeros(shape, np.int64),
            "xid": np.full(shape, -1),
        }
        self.gpu = {k: np.broadcast_to(v, shape).copy() for k, v in self.gpu.items()}
        hb = self.busy[None, :]
        self.host = {
            "cpu_pct": np.where(hb, rng.uniform(25, 35, (T, N)), rng.uniform(0.5, 2, (T, N))),
            "load1": np.where(hb, rng.uniform(14, 18, (T, N)), rng.uniform(0.1, 0.5, (T, N))),
            "mem_used_pct": np.full((T, N), 50.0),
        }
        pshape = (T, N, PORTS)
        nb = self.busy[None, :, None]
        # cumulative counters, written as they are
        self.nic: dict[str, np.ndarray] = {
            "rate_gbps": np.full(pshape, 400.0),
            "state": np.full(pshape, "ACTIVE", dtype=object),
            "symbol_errors": np.zeros(pshape, np.int64),
            "link_error_recovery": np.zeros(pshape, np.int64),
            "link_downed": np.zeros(pshape, np.int64),
            "rcv_errors": np.zeros(pshape, np.int64),
            "xmit_wait": np.cumsum(np.where(nb, rng.integers(10_000, 20_000, pshape), 0), 0),
            "xmit_bytes": np.cumsum(np.where(nb, 2 * 10**9, 0) + 0 * rng.integers(0, 1, pshape), 0),
        }
        self.nic = {k: np.broadcast_to(v, pshape).copy() for k, v in self.nic.items()}
        # per-sample multiplier of each rank's compute time (rank = node * 8 + gpu)
        self.slow = np.ones(shape)
        # which GPUs run a rank of the job (all busy ones, unless a test makes a small job)
        self.ranks = np.broadcast_to(self.busy[:, None], (N, GPUS)).copy()
        self.step_s = 10.0
        self.rng = rng

    def at(self, minute: float) -> int:
        """The sample index at *minute* into the trace."""
        return int(minute * 60 / self.interval)

    def node(self, name: str) -> int:
        return self.names.index(name)

    # --- writing ---------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        out = []
        for i, t0 in enumerate(self.t):
            for n, name in enumerate(self.names):
                if not self.present[i, n]:
                    continue
                ts = round(float(t0 + self.skew[n]) + 0.1, 3)
                for g in range(GPUS):
                    vals = {k: v[i, n, g].item() for k, v in self.gpu.items()}
                    vals["xid"] = None if vals["xid"] < 0 else vals["xid"]
                    out.append(schema.make_record("gpu", name, ts, gpu=g, **vals))
                out.append(
                    schema.make_record(
                        "host", name, ts, **{k: float(v[i, n]) for k, v in self.host.items()}
                    )
                )
                for p in range(PORTS):
                    vals = {k: v[i, n, p] for k, v in self.nic.items()}
                    vals = {k: (v.item() if hasattr(v, "item") else v) for k, v in vals.items()}
                    out.append(
                        schema.make_record("nic", name, ts, device=f"mlx5_{p}", port=1, **vals)
                    )
        return out

    def step_records(self) -> list[dict[str, Any]]:
        busy = np.flatnonzero(self.busy)
        out = []
        steps = int((self.t[-1] - self.t[0]) / self.step_s)
        for k in range(1, steps + 1):
            ts = self.t[0] + k * self.step_s
            i = min(int(np.searchsorted(self.t, ts)), self.t.size - 1)
            compute = {
                (n, g): 7.0 * self.slow[i, n, g] * (1 + self.rng.normal(0, 0.005))
                for n in busy
                for g in range(GPUS)
                if self.ranks[n, g]
            }
            step_s = max(compute.values()) + 3.0
            for (n, g), c in compute.items():
                rank = int(np.searchsorted(busy, n)) * GPUS + g
                out.append(
                    schema.make_record(
                        "step",
                        self.names[n],
                        round(float(ts + self.skew[n]), 3),
                        job="j1",
                        rank=rank,
                        step=k,
                        step_s=round(step_s, 4),
                        compute_s=round(c, 4),
                        comm_s=round(step_s - c, 4),
                    )
                )
        return out

    def write(self) -> Path:
        files: dict[Path, list[str]] = {}
        for rec in self.records():
            files.setdefault(
                layout.node_telemetry_file(self.root, rec["node"], rec["ts"]), []
            ).append(schema.dumps(rec))
        for rec in self.step_records():
            path = layout.step_file(self.root, rec["job"], rec["node"], rec["rank"], rec["ts"])
            files.setdefault(path, []).append(schema.dumps(rec))
        for path, lines in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
        return self.root

    def write_afresh(self) -> Path:
        """Write this trace as the store's whole history: the records there before, and the
        closed segments made of them, go first. Writing over them instead would rewrite files
        in place, which no writer does (the store's files only grow): a file rewritten at
        least as long, on its old inode, reads as the old file grown."""
        for top in (layout.telemetry_dir, layout.steps_dir, layout.segments_dir):
            shutil.rmtree(top(self.root), ignore_errors=True)
        return self.write()

    def analyze(self, *assignments: str, at: float | None = None) -> Analysis:
        self.write()
        settings = load_settings(assignments=assignments, environ={})
        return analyze(self.root, settings, at)


def verdicts(result: Analysis) -> dict[str, str]:
    return {n.node: n.verdict for n in result.nodes}


def detectors_of(result: Analysis, node: str) -> set[str]:
    v = result.verdict_of(node)
    assert v is not None, node
    return {e.detector for e in v.evidence}
