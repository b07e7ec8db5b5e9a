"""Telemetry interchange schema v1: record kinds, field types, validation, reading.

JSON Lines, one record per line, UTF-8. Every record has ``v`` (1), ``kind``,
``ts`` (Unix seconds) and ``node``. Unknown fields are ignored, a missing
optional field is allowed, and a bad line is skipped and counted, never fatal.
This module is the single definition of the contract, and :data:`FIELDS` its
one list of fields: writers (agent, probe, simulate) build records with
:func:`make_record`, readers use :func:`parse_line` / :func:`read_path`, and
the column layout of the analyzer and of the column mirrors is derived from
it (:mod:`guardctl.telemetry.columns`). See guardctl-schema(5).

Kinds are only ever added: ``agent`` (the node agent's health per collector,
one record per collector per sample) came after the first four.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

# field -> accepted Python types after json.loads; None allowed where listed in NULLABLE.
_NUM = (int, float)
_INT = (int,)
_STR = (str,)
_BOOL = (bool,)

FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "gpu": {
        "gpu": _INT,
        "sm_clock_mhz": _NUM,
        "power_w": _NUM,
        "power_limit_w": _NUM,
        "temp_c": _NUM,
        "util_pct": _NUM,
        "clock_event_reasons": _INT,
        "ecc_sbe_volatile": _INT,
        "ecc_dbe_volatile": _INT,
        "pcie_replay": _INT,
        "nvlink_crc_errors": _INT,
        "xid": _INT,
        # Optional (added within v1): the job the GPU served, where the source knows it
        # (dcgm-exporter's hpc_job label); the analyzer's peer group where no step record is.
        "job": _STR,
    },
    "host": {"cpu_pct": _NUM, "load1": _NUM, "mem_used_pct": _NUM},
    "nic": {
        "device": _STR,
        "port": _INT,
        "state": _STR,
        "rate_gbps": _NUM,
        "symbol_errors": _INT,
        "link_error_recovery": _INT,
        "link_downed": _INT,
        "rcv_errors": _INT,
        "xmit_wait": _INT,
        "xmit_bytes": _INT,
    },
    "step": {
        "job": _STR,
        "rank": _INT,
        "step": _INT,
        "step_s": _NUM,
        "compute_s": _NUM,
        "comm_s": _NUM,
        # Optional (added within v1): the rank's work in the step (samples, or tokens
        # where sequence lengths vary; one unit per job) and its parallel role.
        "samples": _INT,
        "pp_stage": _INT,
        "dp_rank": _INT,
        "tp_rank": _INT,
    },
    # The agent's own health: how each collector's last sample went (as node_exporter's
    # *_collector_success), so that readers can tell a broken collector from no data.
    "agent": {
        "collector": _STR,
        "state": _STR,  # ok, partial, error, timeout, busy, unavailable
        "ok": _BOOL,
        "duration_s": _NUM,
        "error": _STR,
    },
}
# Fields a record of that kind cannot be used without.
REQUIRED: dict[str, tuple[str, ...]] = {
    "gpu": ("gpu",),
    "host": (),
    "nic": ("device", "port"),
    "step": ("job", "rank", "step_s"),
    "agent": ("collector", "ok"),
}
# Fields whose null means "none in this interval" rather than "missing".
NULLABLE = frozenset({"xid"})
KINDS = tuple(FIELDS)


class BadRecord(ValueError):
    """A line that is not a valid v1 record; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _check_value(name: str, value: Any, types: tuple[type, ...]) -> None:
    if value is None:
        if name in NULLABLE:
            return
        raise BadRecord("wrong_type", f"{name} is null")
    if isinstance(value, bool) is not (types is _BOOL) or not isinstance(value, types):
        raise BadRecord("wrong_type", f"{name}={value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRecord("not_finite", name)
    if types is _NUM and isinstance(value, int) and not _fits_float(value):
        raise BadRecord("not_finite", name)


def _fits_float(value: int) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer beyond any float: no number a reader can use
        return False


def validate(obj: Any) -> dict[str, Any]:
    """Return *obj* if it is a valid v1 record, else raise :class:`BadRecord`."""
    if not isinstance(obj, dict):
        raise BadRecord("not_an_object")
    if obj.get("v") != SCHEMA_VERSION:
        raise BadRecord("unknown_version", repr(obj.get("v")))
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in FIELDS:  # a list or dict kind is unhashable
        raise BadRecord("unknown_kind", repr(kind))
    ts = obj.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
        raise BadRecord("bad_ts", repr(ts))
    if not (math.isfinite(ts) if isinstance(ts, float) else _fits_float(ts)):
        raise BadRecord("bad_ts", repr(ts))
    node = obj.get("node")
    if not isinstance(node, str) or not node:
        raise BadRecord("bad_node", repr(node))
    spec = FIELDS[kind]
    for name in REQUIRED[kind]:
        if name not in obj:
            raise BadRecord("missing_field", name)
    for name, types in spec.items():
        if name in obj:
            _check_value(name, obj[name], types)
    return obj


def parse_line(line: str | bytes) -> dict[str, Any]:
    """Parse and validate one JSON line; raise :class:`BadRecord` if it is not a v1 record."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # JSONDecodeError is a ValueError; absurdly deep nesting exhausts the recursion limit.
        raise BadRecord("not_json", str(exc)[:80]) from None
    return validate(obj)


def make_record(kind: str, node: str, ts: float, **values: Any) -> dict[str, Any]:
    """Build a v1 record (the writers' single entry point); validates it too."""
    record: dict[str, Any] = {"v": SCHEMA_VERSION, "kind": kind, "ts": ts, "node": node}
    record.update(values)
    return validate(record)


def dumps(record: dict[str, Any]) -> str:
    """Serialise one record as one line (no trailing newline), compactly."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


@dataclass
class ReadResult:
    """Records read from a file or directory, and what was skipped and why."""

    records: list[dict[str, Any]] = field(default_factory=list)
    bad: Counter[str] = field(default_factory=Counter)
    files: int = 0
    lines: int = 0

    @property
    def bad_total(self) -> int:
        return sum(self.bad.values())


def input_files(path: Path) -> list[Path]:
    """The ``*.jsonl`` files under *path* (recursively), or *path* itself if it is a file."""
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*.jsonl") if p.is_file())
    raise FileNotFoundError(str(path))


def iter_file(path: Path, bad: Counter[str]) -> Iterator[dict[str, Any]]:
    """Yield the valid records of one file, counting bad lines into *bad*."""
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                # A last line without newline is a write cut short: never trust it.
                bad["truncated"] += 1
                continue
            try:
                yield parse_line(raw)
            except BadRecord as exc:
                bad[exc.reason] += 1


def read_path(path: Path) -> ReadResult:
    """Read every valid record under *path*; bad lines are counted, never fatal."""
    result = ReadResult()
    for file in input_files(path):
        result.files += 1
        for record in iter_file(file, result.bad):
            result.records.append(record)
        # lines = good + bad, for reporting
    result.lines = len(result.records) + result.bad_total
    return result
