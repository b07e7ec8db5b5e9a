"""Where things live in the shared store: the one definition of its directory layout.

::

    <root>/telemetry/<node>/<YYYYmmddTHH>.jsonl   node agent records (gpu, host, nic);
                                                  one writer: that node's agent
    <root>/steps/<job>/<node>.r<rank>.<hour>.jsonl probe step records; one writer: that rank
    <root>/actions/actions.jsonl                     guardctl's append-only action log
    <root>/sweeps/<sweep id>/                        sweep jobs' outputs and judged results
    <root>/baselines/                                learnt sweep baselines
    <root>/dds/<job>/                                the data-sharding service of one job
    <root>/cache/                                    derived, rebuildable data (analyzer summaries)
    <root>/control/lease.json                        the controller's leader lease
    <root>/control/passes/<host>.json                each controller's last pass (its liveness)
    <root>/clocks/<role>.<name>.json                 each writer's clock heartbeat (guardctl.clock)

Hourly files (UTC) keep each file small, make retention a matter of deleting
whole files, and keep one writer per file so that no locking is needed.
"""

from __future__ import annotations

import time
from pathlib import Path

from guardctl.nodes import validate_name


def hour_stamp(ts: float) -> str:
    """The UTC hour a timestamp falls in, as used in file names: ``20261130T14``."""
    return time.strftime("%Y%m%dT%H", time.gmtime(ts))


def _safe_component(text: str, what: str) -> str:
    # Job ids and sweep ids become directory names: keep them to a safe alphabet.
    if not text or not all(c.isalnum() or c in "._-" for c in text) or text.startswith("."):
        raise ValueError(f"invalid {what} {text!r}")
    return text


def telemetry_dir(root: Path) -> Path:
    return root / "telemetry"


def node_telemetry_file(root: Path, node: str, ts: float) -> Path:
    return telemetry_dir(root) / validate_name(node) / f"{hour_stamp(ts)}.jsonl"


def steps_dir(root: Path) -> Path:
    return root / "steps"


def step_file(root: Path, job: str, node: str, rank: int, ts: float) -> Path:
    job_dir = steps_dir(root) / _safe_component(job, "job id")
    return job_dir / f"{validate_name(node)}.r{int(rank)}.{hour_stamp(ts)}.jsonl"


def actions_log(root: Path) -> Path:
    return root / "actions" / "actions.jsonl"


def sweeps_dir(root: Path) -> Path:
    return root / "sweeps"


def sweep_dir(root: Path, sweep_id: str) -> Path:
    return sweeps_dir(root) / _safe_component(sweep_id, "sweep id")


def baselines_dir(root: Path) -> Path:
    return root / "baselines"


def dds_dir(root: Path, job: str) -> Path:
    return root / "dds" / _safe_component(job, "job id")


def cache_dir(root: Path) -> Path:
    return root / "cache"


def clocks_dir(root: Path) -> Path:
    return root / "clocks"


def control_passes_dir(root: Path) -> Path:
    return root / "control" / "passes"


def telemetry_inputs(root: Path) -> list[Path]:
    """The directories holding schema-v1 records (what ``analyze`` reads by default)."""
    return [telemetry_dir(root), steps_dir(root)]
