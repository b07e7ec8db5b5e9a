"""Durations and times as operators type them: ``300``, ``5m``, ``24h``; Unix or ISO times."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from guardctl.errors import UsageError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str, what: str = "duration") -> float:
    """``300`` / ``300s`` / ``5m`` / ``24h`` / ``7d`` -> seconds (positive)."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"{what}: expected a duration like 300, 5m, 24h or 7d, got {text!r}")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not seconds > 0 or not math.isfinite(seconds):
        raise UsageError(f"{what}: must be positive, got {text!r}")
    return seconds


def parse_time(text: str, what: str = "time") -> float:
    """Unix seconds (``1764547200``) or ISO 8601 (``2025-12-01T00:00:00Z``; naive = UTC)."""
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(
                f"{what}: expected Unix seconds or an ISO time like 2025-12-01T00:00:00Z, "
                f"got {text!r}"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what}: must be a time after 1970, got {text!r}")
    return value


def iso(ts: float) -> str:
    """A timestamp as ``2025-12-01T00:05:00Z`` (for tables and reports)."""
    if not math.isfinite(ts):
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
