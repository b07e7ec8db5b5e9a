"""Qualification: sweep the nodes that come back from someone else's repair, and a healthy sample.

Baselines are learnt from passing figures. Learnt only from suspects, a fleet of slowly degrading
nodes would lower its own bar; so, as Guard does, a node that returns to service after someone
else drained or downed it (a repair) is quarantined and swept before production work lands on it,
and optionally a few idle healthy nodes are swept on a schedule (``sweep.qualify_sample`` every
``sweep.qualify_interval_s``). Their passing figures feed the baselines like any sweep's, and a
node that came back broken is drained before a training job meets it; one whose sweep measured
nothing (undetermined) stays quarantined for an operator, never drained.

What was held by someone else at the last look is remembered in the store
(``<store>/sweeps/qualify.json``); :func:`qualify` is what the mitigation controller calls every
pass, and ``guardctl qualify`` runs one pass by hand.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl.config import Settings
from guardctl.errors import StoreError
from guardctl.fileio import atomic_write
from guardctl.nodeops import NodeOps, NodeStatus
from guardctl.nodeops.rules import out_limit
from guardctl.storage import layout
from guardctl.sweep.engine import Kind, Progress, SweepOptions, SweepReport, run_sweep

STATE_FILE = "qualify.json"


@dataclass
class QualifyState:
    """What qualification remembers between passes."""

    held: list[str] = field(default_factory=list)  # held by someone else at the last look
    returned: list[str] = field(default_factory=list)  # back in service, not yet swept
    last_swept: dict[str, float] = field(default_factory=dict)  # node -> when qualified

    def as_dict(self) -> dict[str, Any]:
        return {"held": self.held, "returned": self.returned, "last_swept": self.last_swept}


@dataclass
class QualifyReport:
    """One qualification pass: which nodes came back, which were sampled, the sweep run."""

    returned: list[str]
    sampled: list[str]
    deferred: list[str]  # over the cap this pass: swept in a later one
    dry_run: bool
    sweep: SweepReport | None = None

    @property
    def failed(self) -> bool:
        return self.sweep is not None and self.sweep.failed

    def as_dict(self) -> dict[str, Any]:
        return {
            "returned": self.returned,
            "sampled": self.sampled,
            "deferred": self.deferred,
            "dry_run": self.dry_run,
            "sweep": self.sweep.as_dict() if self.sweep is not None else None,
        }


def state_path(root: Path) -> Path:
    return layout.sweeps_dir(root) / STATE_FILE


def load_state(root: Path) -> QualifyState:
    try:
        data = json.loads(state_path(root).read_text(encoding="utf-8"))
        return QualifyState(
            [str(n) for n in data.get("held", [])],
            [str(n) for n in data.get("returned", [])],
            {str(k): float(v) for k, v in data.get("last_swept", {}).items()},
        )
    except FileNotFoundError:
        return QualifyState()
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise StoreError(f"cannot read {state_path(root)}: {exc}") from None


def save_state(root: Path, state: QualifyState) -> None:
    path = state_path(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {path.parent}: {exc.strerror}") from None
    atomic_write(path, json.dumps(state.as_dict(), indent=1, sort_keys=True) + "\n")


def returned_from_repair(state: QualifyState, statuses: Sequence[NodeStatus]) -> QualifyState:
    """The state after this look: who is held by someone else now, who came back from it."""
    now = {s.name: s.owner for s in statuses}
    held = sorted(n for n, owner in now.items() if owner == "held by someone else")
    back = [
        n for n in [*state.returned, *state.held] if now.get(n) == "in service" and n not in held
    ]
    return QualifyState(held, list(dict.fromkeys(back)), dict(state.last_swept))


def sample(
    settings: Settings,
    state: QualifyState,
    statuses: Sequence[NodeStatus],
    exclude: Sequence[str],
    now: float,
) -> list[str]:
    """Idle in-service nodes due for a qualification sweep, those swept longest ago first."""
    cfg = settings.sweep
    if cfg.qualify_sample <= 0:
        return []
    due = [
        s.name
        for s in statuses
        if s.owner == "in service"
        and s.slurm_state == "idle"
        and s.name not in exclude
        and s.name not in cfg.good_nodes
        and now - state.last_swept.get(s.name, 0.0) >= cfg.qualify_interval_s
    ]
    due.sort(key=lambda n: state.last_swept.get(n, 0.0))
    return due[: cfg.qualify_sample]


def qualify(
    settings: Settings,
    *,
    ops: NodeOps | None = None,
    dry_run: bool = False,
    kind: Kind = "all",
    duration_s: float | None = None,
    progress: Progress = lambda _msg: None,
    now: float | None = None,
) -> QualifyReport:
    """One qualification pass: sweep the nodes back from repair and the sample that is due."""
    ops = ops or NodeOps(settings)
    root = settings.store.root
    when = time.time() if now is None else now
    dry = dry_run or settings.safety.observe_only
    statuses = ops.status()
    state = returned_from_repair(load_state(root), statuses)
    sampled = sample(settings, state, statuses, state.returned, when)
    # Stay under the cap: the rest waits for the next pass (returned nodes first).
    held = sum(1 for s in statuses if s.owner in ("quarantined", "drained by guardctl"))
    room = max(0, out_limit(settings.safety, len(statuses)) - held)
    wanted = [*state.returned, *sampled]
    chosen, deferred = wanted[:room], wanted[room:]
    report = QualifyReport(state.returned, [n for n in sampled if n in chosen], deferred, dry)
    if chosen:
        progress(f"qualify: sweeping {', '.join(chosen)}")
        report.sweep = run_sweep(
            settings, chosen, SweepOptions(kind, duration_s, dry), ops=ops, progress=progress
        )
    if not dry:
        # An undetermined node stays quarantined (neither drained nor released) and is not
        # counted as qualified: a later sample sweeps it again once an operator releases it.
        unmeasured = (
            {v.node for v in report.sweep.verdicts if v.verdict == "undetermined"}
            if report.sweep
            else set()
        )
        state.returned = [n for n in state.returned if n not in chosen]
        state.last_swept.update({n: when for n in chosen if n not in unmeasured})
        save_state(root, state)
    return report
