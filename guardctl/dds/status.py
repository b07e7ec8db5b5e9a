"""Progress of a job's data sharding, read from the service's database.

Reading the database (not asking the service) means ``guardctl dds status``
also works while the service is down or restarting; WAL mode lets it read
while the service writes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from guardctl.dds.dataset import JobSpec
from guardctl.dds.store import StateDB
from guardctl.errors import StoreError


def read_status(path: Path, job: str) -> dict[str, Any]:
    """:func:`job_status` from a connection of its own, read-only (any thread may call it)."""
    db = StateDB(path, readonly=True)
    try:
        return job_status(db, job)
    finally:
        db.close()


def job_status(db: StateDB, job: str, now: float | None = None) -> dict[str, Any]:
    """The epoch's progress, each worker's speed and share, leases in flight and expired."""
    now = time.time() if now is None else now
    meta = db.meta()
    if "spec" not in meta:
        raise StoreError(f"{db.path} holds no data-sharding state")
    spec = JobSpec.from_json(json.loads(meta["spec"]))
    done = dict(db.rows("SELECT epoch, COUNT(*) FROM lease WHERE state = 'done' GROUP BY epoch"))
    current = next((e for e in range(spec.epochs) if done.get(e, 0) < spec.shards), spec.epochs)
    steps = _steps(db, spec)
    if steps is not None:  # per-step mode: progress is the furthest step handed out
        current = min(steps["last_split"] // steps["steps_per_epoch"], spec.epochs - 1)
        if steps["last_split"] + 1 >= steps["total_steps"]:
            current = spec.epochs
    leases = dict(db.rows("SELECT state, COUNT(*) FROM lease GROUP BY state"))
    overdue = db.rows("SELECT COUNT(*) FROM lease WHERE state = 'active' AND expires < ?", (now,))[
        0
    ][0]
    return {
        "job": job,
        "mode": meta.get("mode", "") or "idle",
        "generation": int(meta.get("gen", "0")),
        "dataset": {
            "records": spec.total,
            "shard_size": spec.shard_size,
            "shards": spec.shards,
            "epochs": spec.epochs,
            "seed": spec.seed,
            "global_batch": spec.global_batch,
        },
        "epoch": current,
        "finished": current >= spec.epochs,
        "progress": _progress(spec, done, current, steps),
        "leases": {
            "in_flight": int(leases.get("active", 0)),
            "overdue": int(overdue),
            "expired": int(leases.get("expired", 0)),
            "revoked": int(leases.get("revoked", 0)),
            "done": int(leases.get("done", 0)),
        },
        "steps": steps,
        "workers": _workers(db, now),
        "checkpoints": [
            {"name": n, "seq": s, "step": st, "created": c}
            for n, s, st, c in db.rows(
                "SELECT name, seq, step, created FROM checkpoint ORDER BY ord"
            )
        ],
    }


def _progress(
    spec: JobSpec, done: dict[int, int], current: int, steps: dict[str, Any] | None
) -> dict[str, Any]:
    if steps is not None:
        spe, last = steps["steps_per_epoch"], steps["last_split"]
        return {
            "epoch_steps_done": last % spe + 1,
            "epoch_fraction": round((last % spe + 1) / spe, 4),
            "total_steps_done": last + 1,
            "total_fraction": round((last + 1) / steps["total_steps"], 4),
        }
    epoch = min(current, spec.epochs - 1)
    count = done.get(epoch, 0)
    return {
        "epoch_shards_done": count,
        "epoch_fraction": round(count / spec.shards, 4),
        "total_shards_done": sum(done.values()),
        "total_fraction": round(sum(done.values()) / (spec.shards * spec.epochs), 4),
    }


def _steps(db: StateDB, spec: JobSpec) -> dict[str, Any] | None:
    last = db.rows("SELECT step, shares FROM step ORDER BY step DESC LIMIT 1")
    if not last:
        return None
    step, shares = last[0]
    return {
        "last_split": step,
        "steps_per_epoch": spec.steps_per_epoch,
        "total_steps": spec.steps_per_epoch * spec.epochs,
        "shares": json.loads(shares),
    }


def _workers(db: StateDB, now: float) -> list[dict[str, Any]]:
    counted = dict(
        db.rows("SELECT worker, COUNT(*) FROM lease WHERE state = 'done' GROUP BY worker")
    )
    in_flight = dict(
        db.rows("SELECT worker, COUNT(*) FROM lease WHERE state = 'active' GROUP BY worker")
    )
    total = sum(counted.values()) or 1
    last = db.rows("SELECT shares FROM step ORDER BY step DESC LIMIT 1")
    step_shares: list[int] = json.loads(last[0][0]) if last else []
    out = []
    for name, rank, speed, samples, seconds, last_step, seen in db.rows(
        "SELECT worker, rank, speed, samples, seconds, last_step, last_seen FROM worker "
        "ORDER BY rank, worker"
    ):
        if step_shares and rank is not None and 0 <= rank < len(step_shares):
            share = step_shares[rank] / (sum(step_shares) or 1)
        else:
            share = counted.get(name, 0) / total
        out.append(
            {
                "worker": name,
                "rank": rank,
                "speed": None if speed is None else round(speed, 3),
                "share": round(share, 4),
                "shards_done": int(counted.get(name, 0)),
                "in_flight": int(in_flight.get(name, 0)),
                "samples": samples,
                "busy_s": round(seconds, 3),
                "last_step": last_step,
                "idle_s": round(max(now - seen, 0.0), 1),
            }
        )
    return out
