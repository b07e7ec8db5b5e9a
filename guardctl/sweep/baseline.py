"""Learnt sweep baselines: what a healthy GPU model / node shape achieves in this fleet.

A baseline is kept per key (sweep, device model, node shape: ``gemm|NVIDIA
H200|8x``; on CPU-only nodes the CPU model and core count) and is the median of
the most recent passing figures, learnt from sweeps across the fleet; never a
datasheet number. Stored under ``layout.baselines_dir(root)``, one JSON file per
key, replaced atomically under a lock so that concurrent sweeps don't tear it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guardctl.errors import StoreError
from guardctl.fileio import atomic_write, locked
from guardctl.storage import layout
from guardctl.sweep.registry import Measurement

RESULTS_FILE = "results.json"  # written by the sweep engine in each sweep's directory


@dataclass(frozen=True)
class Baseline:
    """The reference figure for one key and the passing figures it is the median of."""

    key: str
    metric: str
    value: float
    history: tuple[dict[str, Any], ...]  # {"value", "node", "unit", "sweep", "ts"}, oldest first
    updated: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "metric": self.metric,
            "value": self.value,
            "count": len(self.history),
            "updated": self.updated,
            "history": list(self.history),
        }


def _file(root: Path, key: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")[:80]
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    return layout.baselines_dir(root) / f"{slug}-{digest}.json"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    directory = layout.baselines_dir(root)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot write baselines in {directory}: {exc.strerror}") from None
    with locked(directory / ".lock"):
        yield


def load_all(root: Path) -> dict[str, Baseline]:
    """Every stored baseline by key (unreadable files are skipped: they are rebuilt by update)."""
    out: dict[str, Baseline] = {}
    directory = layout.baselines_dir(root)
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            base = Baseline(
                str(data["key"]),
                str(data["metric"]),
                float(data["value"]),
                tuple(data.get("history", ())),
                float(data.get("updated", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out[base.key] = base
    return out


def values(root: Path) -> dict[str, float]:
    """key -> reference value, what the judge needs."""
    return {k: b.value for k, b in load_all(root).items()}


def _entry(m: Measurement, sweep_id: str, ts: float) -> dict[str, Any]:
    return {
        "value": m.value,
        "node": "+".join(m.nodes),
        "unit": m.unit,
        "sweep": sweep_id,
        "ts": ts,
    }


def _make(key: str, metric: str, history: list[dict[str, Any]], keep: int) -> Baseline:
    kept = history[-keep:]
    return Baseline(
        key, metric, round(statistics.median(e["value"] for e in kept), 6), tuple(kept), time.time()
    )


def _write(root: Path, base: Baseline) -> None:
    atomic_write(_file(root, base.key), json.dumps(base.as_dict(), indent=1) + "\n")


def learn(
    root: Path,
    passing: Iterable[Measurement],
    *,
    sweep_id: str,
    keep: int = 20,
    ts: float | None = None,
) -> list[Baseline]:
    """Add passing figures of one sweep to their keys' baselines; return the changed baselines."""
    by_key: dict[str, list[Measurement]] = {}
    for m in passing:
        by_key.setdefault(m.key, []).append(m)
    if not by_key:
        return []
    now = time.time() if ts is None else ts
    changed = []
    with _locked(root):
        current = load_all(root)
        for key, ms in sorted(by_key.items()):
            old = list(current[key].history) if key in current else []
            if any(e.get("sweep") == sweep_id for e in old):
                continue  # this sweep was learnt already: learning is idempotent
            base = _make(key, ms[0].metric, old + [_entry(m, sweep_id, now) for m in ms], keep)
            _write(root, base)
            changed.append(base)
    return changed


def stored_results(root: Path, sweep_ids: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
    """The judged results of stored sweeps (all, or those named), oldest first."""
    wanted = set(sweep_ids)
    directory = layout.sweeps_dir(root)
    paths = sorted(directory.glob(f"*/{RESULTS_FILE}")) if directory.is_dir() else []
    found = set()
    for path in paths:
        if wanted and path.parent.name not in wanted:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found.add(path.parent.name)
        yield data
    missing = wanted - found
    if missing:
        raise StoreError(f"no results stored for sweep(s): {', '.join(sorted(missing))}")


def rebuild(
    root: Path, *, keep: int = 20, sweep_ids: Iterable[str] = (), dry_run: bool = False
) -> list[Baseline]:
    """Recompute baselines from the passing figures of stored sweeps (all of them by default)."""
    history: dict[str, list[dict[str, Any]]] = {}
    metrics: dict[str, str] = {}
    for data in sorted(stored_results(root, sweep_ids), key=lambda d: d.get("started", 0)):
        for j in data.get("judgements", []):
            if not j.get("passed") or j.get("error") or j.get("wrong"):
                continue
            try:
                m = Measurement.from_dict(j)
            except (KeyError, TypeError, ValueError):
                continue
            history.setdefault(m.key, []).append(
                _entry(m, str(data.get("sweep_id", "")), float(data.get("started", 0)))
            )
            metrics[m.key] = m.metric
    built = [_make(k, metrics[k], h, keep) for k, h in sorted(history.items())]
    if not dry_run:
        with _locked(root):
            for base in built:
                _write(root, base)
    return built
