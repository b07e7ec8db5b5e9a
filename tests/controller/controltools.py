"""Helpers for the controller's tests: telemetry of the lab's nodes, ending now, and guardctl."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
for sub in ("analyze", "sweep"):
    if str(HERE.parent / sub) not in sys.path:
        sys.path.insert(0, str(HERE.parent / sub))

from anatrace import Trace  # noqa: E402
from sweeptools import Guardctl, make_guardctl  # noqa: E402

from guardctl.fileio import atomic_write  # noqa: E402
from guardctl.storage import layout  # noqa: E402
from guardctl.telemetry import schema  # noqa: E402

__all__ = ["Guardctl", "ShardedTrace", "Trace", "control_guardctl", "fleet_trace"]

CONTROL = """
[control]
sweep_kind = "single"
sweep_duration_s = 2.0
lease_s = 30.0
interval_s = 1.0
"""


def fleet_trace(
    store: Path,
    names: list[str],
    *,
    slow: dict[str, float] | None = None,
    hw_slowdown: list[str] | None = None,
    contention: list[str] | None = None,
    minutes: int = 20,
    seed: int = 7,
    replace: bool = False,
) -> Trace:
    """A job on *names* whose telemetry ends now: *slow* ranks compute longer (busy time);
    *hw_slowdown* GPUs report NVML's HW-slowdown clock event; *contention* nodes a high load.
    *replace*: files replaced whole (new inodes), for a running controller to read anew."""
    tr = Trace(store, nodes=len(names), minutes=minutes, seed=seed)
    tr.names = list(names)
    # Ends now, not a moment before: a pass the controller recorded a second ago must predate a
    # relapse's data, or the relapse reads as "flagged only on data from before its sweep passed".
    tr.t = tr.t - tr.t[-1] + time.time()
    onset = tr.at(2)
    for node, factor in (slow or {}).items():
        tr.slow[onset:, tr.node(node), 3] = factor
    for node in hw_slowdown or []:
        tr.gpu["clock_event_reasons"][onset:, tr.node(node), :] = 0x8
        tr.gpu["sm_clock_mhz"][onset:, tr.node(node), :] = 1200
    for node in contention or []:
        tr.host["load1"][onset:, tr.node(node)] = 90.0
    if replace:
        write_replacing(tr, tr.step_records())
    else:
        tr.write()
    return tr


def write_replacing(tr: Trace, steps: list[dict[str, Any]]) -> None:
    """Write *tr*'s records and *steps* as Trace.write does, each file replaced whole."""
    files: dict[Path, list[str]] = {}
    for rec in tr.records():
        path = layout.node_telemetry_file(tr.root, rec["node"], rec["ts"])
        files.setdefault(path, []).append(schema.dumps(rec))
    for rec in steps:
        path = layout.step_file(tr.root, rec["job"], rec["node"], rec["rank"], rec["ts"])
        files.setdefault(path, []).append(schema.dumps(rec))
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, "\n".join(lines) + "\n", fsync=False)


def control_guardctl(
    tmp_path: Path, lab: object, *, sweep: str = "", control: str = "", sections: str = ""
) -> Guardctl:
    """guardctl with a private store on the lab: fast sweeps and a fast controller
    (*sections*: more configuration tables, e.g. ``[source]``)."""
    mine = {line.split("=")[0].strip() for line in control.splitlines() if "=" in line}
    base = [line for line in CONTROL.splitlines() if line.split("=")[0].strip() not in mine]
    return make_guardctl(
        tmp_path, lab, extra=sweep + "\n".join(base) + "\n" + control + "\n" + sections
    )


class ShardedTrace(Trace):
    """A job the data-sharding service serves: its step records count each rank's samples, and
    *slow* ranks take *factor* times longer per sample. From *rebalanced* (a minute into the
    trace; None: never) the service gives them 1/factor of the samples, so the job's step time
    recovers while their busy time per sample stays behind (the node stays flagged).

    The trace ends at *end*. Files are replaced whole (a new inode), so a longer trace of the
    same start written later is read as new data by a controller's incremental analyzer."""

    SAMPLES = 32
    PER_SAMPLE_S = 7.0 / 32

    def __init__(
        self,
        store: Path,
        names: list[str],
        job: str,
        *,
        slow: str,
        factor: float,
        minutes: int,
        end: float,
        rebalanced: float | None = None,
    ) -> None:
        super().__init__(store, nodes=len(names), minutes=minutes, seed=7)
        self.names, self.job = list(names), job
        self.t = self.t - self.t[-1] + end
        self.slow[self.at(2) :, self.node(slow), :] = factor
        self.shares = np.full(self.slow.shape, self.SAMPLES)
        if rebalanced is not None:
            self.shares[self.at(rebalanced) :, self.node(slow), :] = round(self.SAMPLES / factor)

    def step_records(self) -> list[dict[str, Any]]:
        out = []
        for k in range(1, int((self.t[-1] - self.t[0]) / self.step_s) + 1):
            ts = self.t[0] + k * self.step_s
            i = min(int(np.searchsorted(self.t, ts)), self.t.size - 1)
            work = {
                (n, g): (
                    int(self.shares[i, n, g]),
                    self.PER_SAMPLE_S
                    * self.shares[i, n, g]
                    * self.slow[i, n, g]
                    * (1 + self.rng.normal(0, 0.005)),
                )
                for n in range(self.n)
                for g in range(8)
            }
            step_s = max(c for _, c in work.values()) + 3.0
            out += [
                schema.make_record(
                    "step",
                    self.names[n],
                    round(float(ts), 3),
                    job=self.job,
                    rank=n * 8 + g,
                    step=k,
                    step_s=round(step_s, 4),
                    compute_s=round(c, 4),
                    comm_s=round(step_s - c, 4),
                    samples=samples,
                )
                for (n, g), (samples, c) in work.items()
            ]
        return out

    def write(self) -> Path:
        write_replacing(self, self.step_records())
        return self.root
