"""Writing the simulated fleet as schema-v1 JSON Lines in the store layout, fast.

Lines are produced with fixed templates rather than one ``json.dumps`` per
record: the output is byte-for-byte what ``schema.dumps(schema.make_record(...))``
gives for the same values (the tests check this with ``schema.parse_line``),
at a fraction of the cost, so fleets of 100k GPUs can be written for benchmarks.
Every value is a Python int or float (``tolist``), whose ``repr`` is what JSON uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from guardctl.simulate.fleet import GPUS, PORTS, Fleet, Job
from guardctl.storage import layout
from guardctl.storage.segments import HOUR_MINUTES, check_minutes
from guardctl.telemetry.mirror import Mirror

GPU_LINE = (
    '{"v":1,"kind":"gpu","ts":%r,"node":"%s","gpu":%d,"sm_clock_mhz":%d,"power_w":%r,'
    '"power_limit_w":%r,"temp_c":%r,"util_pct":%d,"clock_event_reasons":%d,'
    '"ecc_sbe_volatile":%d,"ecc_dbe_volatile":%d,"pcie_replay":%d,"nvlink_crc_errors":%d,'
    '"xid":%s}'
)
HOST_LINE = '{"v":1,"kind":"host","ts":%r,"node":"%s","cpu_pct":%r,"load1":%r,"mem_used_pct":%r}'
NIC_LINE = (
    '{"v":1,"kind":"nic","ts":%r,"node":"%s","device":"%s","port":1,"state":"%s",'
    '"rate_gbps":%r,"symbol_errors":%d,"link_error_recovery":%d,"link_downed":%d,'
    '"rcv_errors":%d,"xmit_wait":%d,"xmit_bytes":%d}'
)
STEP_LINE = (
    '{"v":1,"kind":"step","ts":%r,"node":"%s","job":"%s","rank":%d,"step":%d,"step_s":%r,'
    '"compute_s":%r,"comm_s":%r}'
)
# Nodes whose agent lines are made at once (see telemetry_lines).
NODES_AT_ONCE = 512
NIC_COUNTERS = (
    "symbol_errors",
    "link_error_recovery",
    "link_downed",
    "rcv_errors",
    "xmit_wait",
    "xmit_bytes",
)


def _per_node(a: np.ndarray) -> list[Any]:
    """(T, N, ...) -> a flat Python list ordered node by node, then sample, then item."""
    return np.moveaxis(a, 1, 0).reshape(-1).tolist()


def _r(a: np.ndarray, digits: int) -> np.ndarray:
    return np.round(a.astype(np.float64), digits)


Lines = list[tuple[float, str]]


def telemetry_lines(f: Fleet, rng: np.random.Generator) -> Iterator[tuple[int, Lines]]:
    """Per node: (ts, line) of every agent record, in sample order.

    The lines are made NODES_AT_ONCE nodes at a time (the sample times drawn for all
    first, so the bytes do not depend on it): a trace's lines are some ten times the
    fleet's arrays, too many to hold at once at 100k GPUs for more than 20 minutes.
    """
    ts = _r(f.t[:, None] + f.skew[None, :] + rng.uniform(0, 0.2, (f.t.size, f.n)), 3)
    for lo in range(0, f.n, NODES_AT_ONCE):
        yield from _node_lines(f, ts, slice(lo, min(lo + NODES_AT_ONCE, f.n)))


def _node_lines(f: Fleet, ts_all: np.ndarray, nodes: slice) -> Iterator[tuple[int, Lines]]:
    """:func:`telemetry_lines` of the *nodes* (a run of them); *ts_all*: every sample's time."""
    ts = ts_all[:, nodes]
    T, N = ts.shape
    g = {k: v[:, nodes] for k, v in f.g.items()}
    cum = {k: np.cumsum(g[k], axis=0) for k in ("sbe", "dbe", "pcie", "nvlink")}
    gts = np.broadcast_to(ts[:, :, None], (T, N, GPUS))
    names = np.array(f.names[nodes], dtype=object)
    gnode = np.broadcast_to(names[None, :, None], (T, N, GPUS))
    gidx = np.broadcast_to(np.arange(GPUS)[None, None, :], (T, N, GPUS))
    xid = np.where(g["xid"] >= 0, g["xid"].astype(str).astype(object), "null")
    gpu_cols = [
        gts,
        gnode,
        gidx,
        g["clock"].astype(np.int64),
        _r(g["power"], 1),
        _r(g["limit"], 1),
        _r(g["temp"], 1),
        g["util"].astype(np.int64),
        g["reasons"].astype(np.int64),
        cum["sbe"],
        cum["dbe"],
        cum["pcie"],
        cum["nvlink"],
        xid,
    ]
    gpu = [GPU_LINE % row for row in zip(*map(_per_node, gpu_cols), strict=True)]
    host_cols = [
        ts,
        np.broadcast_to(names[None, :], (T, N)),
        _r(f.h["cpu"][:, nodes], 1),
        _r(f.h["load"][:, nodes], 2),
        _r(f.h["mem"][:, nodes], 1),
    ]
    host = [HOST_LINE % row for row in zip(*map(_per_node, host_cols), strict=True)]
    pshape = (T, N, PORTS)
    devices = np.array([f"mlx5_{p}" for p in range(PORTS)], dtype=object)
    nic_cols = [
        np.broadcast_to(ts[:, :, None], pshape),
        np.broadcast_to(names[None, :, None], pshape),
        np.broadcast_to(devices[None, None, :], pshape),
        np.where(f.nic["down"][:, nodes], "DOWN", "ACTIVE").astype(object),
        _r(f.nic["rate"][:, nodes], 1),
    ]
    nic_cols += [
        np.cumsum(f.nic[k][:, nodes], axis=0) + f.nic_base[k][nodes][None] for k in NIC_COUNTERS
    ]
    nic = [NIC_LINE % row for row in zip(*map(_per_node, nic_cols), strict=True)]
    ts_list = _per_node(ts)
    present = f.present[:, nodes]
    for node in range(N):
        lines: Lines = []
        for i in np.flatnonzero(present[:, node]):
            k = node * T + int(i)
            stamp = ts_list[k]
            lines.extend((stamp, line) for line in gpu[k * GPUS : (k + 1) * GPUS])
            lines.append((stamp, host[k]))
            lines.extend((stamp, line) for line in nic[k * PORTS : (k + 1) * PORTS])
        yield nodes.start + node, lines


def job_steps(
    f: Fleet, job: Job, rng: np.random.Generator, end: float
) -> dict[tuple[int, int], list[tuple[float, str]]]:
    """Per (node, rank): (ts, line) of the job's step records.

    Every rank ends a step together (they wait for the slowest at the gradient
    all-reduce): step_s = slowest compute + the all-reduce; comm_s = step_s - compute_s.
    """
    ranks = job.nodes.size * GPUS
    k_max = int((end - job.start) / job.step_s)
    if k_max < 1:
        return {}
    noise = 1 + rng.normal(0, 0.01, (k_max, ranks))
    allreduce = job.step_s * (1 - job.compute_share) * (1 + rng.normal(0, 0.02, k_max))
    ends = job.start + job.step_s * np.arange(1, k_max + 1)
    for _ in range(3):  # a slow step delays every later one: look the slowdown up at the real time
        idx = np.clip(np.searchsorted(f.t, ends), 0, f.t.size - 1)
        slow = f.slow[idx][:, job.nodes, :].reshape(k_max, ranks)
        compute = job.step_s * job.compute_share * slow * noise
        step = compute.max(axis=1) + allreduce * f.comm[idx][:, job.nodes].max(axis=1)
        ends = job.start + np.cumsum(step)
    keep = int(np.searchsorted(ends, end))
    step_l, ends_l = _r(step[:keep], 4).tolist(), ends[:keep]
    comp = _r(compute[:keep], 4)
    comm = _r(step[:keep, None] - comp, 4)
    out: dict[tuple[int, int], list[tuple[float, str]]] = {}
    for r in range(ranks):
        node = int(job.nodes[r // GPUS])
        name = f.names[node]
        stamps = _r(ends_l + f.skew[node], 3).tolist()
        rows = zip(stamps, comp[:, r].tolist(), comm[:, r].tolist(), step_l, strict=True)
        out[(node, r)] = [
            (ts, STEP_LINE % (ts, name, job.name, r, k + 1, s, c, m))
            for k, (ts, c, m, s) in enumerate(rows)
        ]
    return out


def write_segments(
    lines: Iterable[tuple[float, str]],
    path_of: Callable[[float], Path],
    mirror: Mirror | None = None,
) -> int:
    """Append lines to the segment's file each belongs to; return how many were written.

    With *mirror*, each file's column mirror is kept as the agent and the probe keep it.
    """
    by_file: dict[Path, list[str]] = {}
    count = 0
    for ts, line in lines:
        by_file.setdefault(path_of(ts), []).append(line)
        count += 1
    for path, chunk in by_file.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        data = ("\n".join(chunk) + "\n").encode()
        with path.open("ab") as fh:
            start = fh.tell()
            fh.write(data)
        if mirror is not None:
            mirror.append(path, start, data)
            mirror.forget(path)
    return count


def write_fleet(
    f: Fleet,
    root: Path,
    rng: np.random.Generator,
    end: float,
    column_files: bool = True,
    segment_minutes: int = HOUR_MINUTES,
    handoff: bool = False,
) -> int:
    """Write every record of the fleet under the store *root*, one file per *segment_minutes*
    as the agents and probes would; return the record count. With *handoff*, the ranks'
    step records go into their node's file, as where ranks hand them to the node agent
    (one file per node per segment); without, each rank writes its own, as a probe with no
    agent does."""
    total = 0
    mirror = Mirror() if column_files else None
    minutes = check_minutes(segment_minutes)
    for node, lines in telemetry_lines(f, rng):
        name = f.names[node]
        path_of = partial(_telemetry_path, root, name, minutes)
        total += write_segments(lines, path_of, mirror)
    for job in f.jobs:
        for (node, rank), lines in job_steps(f, job, rng, end).items():
            if handoff:
                path_of = partial(_telemetry_path, root, f.names[node], minutes)
            else:
                path_of = partial(_step_path, root, job.name, f.names[node], rank, minutes)
            total += write_segments(lines, path_of, mirror)
    return total


def _telemetry_path(root: Path, node: str, minutes: int, ts: float) -> Path:
    return layout.node_telemetry_file(root, node, ts, minutes)


def _step_path(root: Path, job: str, node: str, rank: int, minutes: int, ts: float) -> Path:
    return layout.step_file(root, job, node, rank, ts, minutes)
