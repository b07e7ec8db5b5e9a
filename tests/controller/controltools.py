"""Helpers for the controller's tests: telemetry of the lab's nodes, ending now, and guardctl."""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for sub in ("analyze", "sweep"):
    if str(HERE.parent / sub) not in sys.path:
        sys.path.insert(0, str(HERE.parent / sub))

from anatrace import Trace  # noqa: E402
from sweeptools import Guardctl, make_guardctl  # noqa: E402

__all__ = ["Guardctl", "Trace", "control_guardctl", "fleet_trace"]

CONTROL = """
[control]
sweep_kind = "single"
sweep_duration_s = 2.0
lease_s = 30.0
interval_s = 1.0
"""


def fleet_trace(store: Path, names: list[str], *, slow: dict[str, float] | None = None,
                hw_slowdown: list[str] | None = None, contention: list[str] | None = None,
                minutes: int = 20, seed: int = 7) -> Trace:
    """A job on *names* whose telemetry ends now: *slow* ranks compute longer (busy time);
    *hw_slowdown* GPUs report NVML's HW-slowdown clock event; *contention* nodes a high load."""
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
    tr.write()
    return tr


def control_guardctl(tmp_path: Path, lab: object, *, sweep: str = "", control: str = "",
                     sections: str = "") -> Guardctl:
    """guardctl with a private store on the lab: fast sweeps and a fast controller
    (*sections*: more configuration tables, e.g. ``[source]``)."""
    mine = {line.split("=")[0].strip() for line in control.splitlines() if "=" in line}
    base = [line for line in CONTROL.splitlines() if line.split("=")[0].strip() not in mine]
    return make_guardctl(tmp_path, lab,
                         extra=sweep + "\n".join(base) + "\n" + control + "\n" + sections)
