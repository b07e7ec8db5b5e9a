"""Helpers for the sweep fault-injection tests: the real controller and sweep engine over the
in-memory Slurm, with fast sweep settings, and what Slurm and the action log say afterwards."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from guardctl.actionlog import Entry
from guardctl.config import Layer, Settings, build_settings
from guardctl.controller import loop
from guardctl.controller.loop import Controller
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import JobInfo

NODES = [f"node{i}" for i in range(1, 9)]


def settings(tmp_path: Path, *, sweep: dict[str, Any] | None = None, **control: Any) -> Settings:
    """A private store on *tmp_path*, fast polled sweeps, room under the cap."""
    return build_settings(
        [
            Layer(
                "test",
                {
                    "store": {"root": str(tmp_path)},
                    "safety": {"max_out_fraction": 0.5},
                    "control": {"sweep_kind": "single", "align": False, **control},
                    "sweep": {
                        "job_timeout_s": 600.0,
                        "poll_interval_s": 0.05,
                        "learn_baselines": False,
                        **(sweep or {}),
                    },
                },
            )
        ]
    )


def daemon(
    tmp_path: Path, slurm: MemorySlurm, *, sweep: dict[str, Any] | None = None, **control: Any
) -> Controller:
    """The controller as its daemon runs it: sweeps started by one pass, polled by the next."""
    c = Controller(settings(tmp_path, sweep=sweep, **control), act=True, slurm=slurm)
    c.as_daemon(10.0)
    return c


def decision(c: Controller, node: str) -> dict[str, Any]:
    return next(d for d in c.run_pass().decisions if d["node"] == node)


def sweep_jobs(slurm: MemorySlurm, node: str, live: bool = True) -> list[JobInfo]:
    """The jobs in *node*'s quarantine reservation (the sweep's), those not ended (*live*)."""
    return [
        j
        for j in slurm.jobs()
        if j.reservation == f"guardctl_q_{node}" and (not live or not j.finished)
    ]


def end_sweep_jobs(slurm: MemorySlurm, node: str, end: Callable[[int], None]) -> list[int]:
    """End every sweep job of *node* with *end*, as each starts (one job per node at a time)."""
    ended = []
    while running := [j for j in sweep_jobs(slurm, node) if j.state == "RUNNING"]:
        for job in running:
            end(job.job_id)
            ended.append(job.job_id)
    return ended


def log(c: Controller, action: str, node: str | None = None) -> list[Entry]:
    return [
        e for e in c.ops.log.entries() if e.action == action and (node is None or node in e.nodes)
    ]


def verdicts(c: Controller, node: str) -> list[str]:
    return [str(e.evidence["verdict"]) for e in log(c, "control sweep", node)]


def drained(slurm: MemorySlurm, node: str) -> bool:
    return next(n for n in slurm.nodes() if n.name == node).drained


def quarantined(slurm: MemorySlurm, node: str) -> bool:
    return any(r.name == f"guardctl_q_{node}" for r in slurm.reservations())


def between_read_and_act(monkeypatch: pytest.MonkeyPatch, happen: Callable[[], object]) -> None:
    """Run *happen* once, right after the next pass has read Slurm and decided, before it acts
    (what lands in that gap: a user's job, an operator's command)."""
    decide = loop.policy.decide
    pending = [happen]

    def decided(view: Any, cfg: Any) -> Any:
        out = decide(view, cfg)
        while pending:
            pending.pop()()
        return out

    monkeypatch.setattr(loop.policy, "decide", decided)


def later(c: Controller, **control: Any) -> None:
    """Change the controller's [control] settings between passes (time moving on, say)."""
    c.cfg = dataclasses.replace(c.cfg, **control)
    c.settings = dataclasses.replace(c.settings, control=c.cfg)


def now() -> float:
    return time.time()
