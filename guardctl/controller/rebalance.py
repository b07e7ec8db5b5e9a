"""Rung a: the running job's data-sharding service already gives the slow rank less work.

The controller does not move the work itself (the service does, from each rank's speed); it
checks that the job gets its speed back. When it takes rung a it records a *watch*: the job's
step time then and what it would be were the node at its peers' pace (the finding's impact,
:mod:`guardctl.analyze.impact`), and the end of the analysis window they come from. Later
passes compare the job's step time in a newer window:

* won back ``[control] recovery`` of the slowdown (step time at most ``before - recovery x
  (before - at peers' pace)``): **recovered**, recorded with the figures; the node stays on
  rung a while that job runs on it;
* not within ``[control] rebalance_window_s`` of rung a, or no newer step records of the job in
  that time (nothing shows the job recovering): **not recovered**, and the node goes on to the
  next rung (quarantine) with that evidence;
* otherwise: still watching.

Pure functions of values (the watch read back from the action log, the finding's impact, the
analysis window, the clock), tested by handing them values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from guardctl.sections.control import ControlSettings

Phase = Literal["watch", "recovered", "not recovered"]


@dataclass(frozen=True)
class Watch:
    """Rung a for one node and job: the step time it started from and what came of it."""

    job: str
    since: float  # when rung a was taken
    step_s: float  # the job's step time then
    step_s_without: float  # the step time then, were the node at its peers' pace
    data_end: float  # end of the analysis window those figures come from
    phase: Phase = "watch"
    why: str = ""
    figures: dict[str, Any] = field(default_factory=dict)  # the latest comparison

    def target(self, share: float) -> float:
        """The step time that counts as recovered: *share* of the slowdown won back."""
        return self.step_s - share * max(0.0, self.step_s - self.step_s_without)

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "job": self.job,
            "since": self.since,
            "step_s": self.step_s,
            "step_s_without": self.step_s_without,
            "data_end": self.data_end,
            "why": self.why,
            **self.figures,
        }


def read(evidence: dict[str, Any]) -> Watch | None:
    """The watch a ``control rebalance`` record holds (None for none or a torn one)."""
    try:
        phase = str(evidence["phase"])
        if phase not in ("watch", "recovered", "not recovered"):
            return None
        known = {"phase", "job", "since", "step_s", "step_s_without", "data_end", "why"}
        return Watch(
            str(evidence["job"]),
            float(evidence["since"]),
            float(evidence["step_s"]),
            float(evidence["step_s_without"]),
            float(evidence["data_end"]),
            phase,  # type: ignore[arg-type]
            str(evidence.get("why", "")),
            {k: v for k, v in evidence.items() if k not in known},
        )
    except (KeyError, TypeError, ValueError):
        return None


def start(
    impact: dict[str, Any] | None, now: float, data_end: float, cfg: ControlSettings
) -> Watch | None:
    """Take rung a on the finding's *impact* (None: no step records, nothing to check)."""
    try:
        job, step_s = str(impact["job"]), float(impact["step_s"])  # type: ignore[index]
        without = float(impact["step_s_without"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    if step_s <= 0:
        return None
    watch = Watch(job, now, step_s, without, data_end)
    return replace(
        watch,
        why=(
            f"the data-sharding service gives the slow rank less work: watching job {job}'s step "
            f"time recover from {step_s:.4g} s toward {without:.4g} s (its peers' pace; "
            f"recovered at <= {watch.target(cfg.recovery):.4g} s) for up to "
            f"{cfg.rebalance_window_s:g} s"
        ),
    )


def check(
    watch: Watch, impact: dict[str, Any] | None, data_end: float, now: float, cfg: ControlSettings
) -> Watch:
    """Compare the job's step time in a newer window with the watch's; see the module doc."""
    target = watch.target(cfg.recovery)
    figures: dict[str, Any] = {"target_s": round(target, 4), "waited_s": round(now - watch.since)}
    fresh = (
        impact is not None
        and str(impact.get("job")) == watch.job
        and data_end > watch.data_end
        and float(impact.get("step_s") or 0) > 0
    )
    if fresh:
        assert impact is not None
        step_now = float(impact["step_s"])
        gap = watch.step_s - watch.step_s_without
        figures.update(
            step_s_now=step_now,
            data_end_now=data_end,
            won_back_pct=round(100 * (watch.step_s - step_now) / gap, 1) if gap > 0 else None,
        )
        if step_now <= target:
            return replace(
                watch,
                phase="recovered",
                figures=figures,
                why=(
                    f"job {watch.job}'s step time recovered: {watch.step_s:.4g} s -> "
                    f"{step_now:.4g} s ({watch.step_s_without:.4g} s at its peers' pace) "
                    f"{now - watch.since:.0f} s after rung a"
                ),
            )
    if now - watch.since < cfg.rebalance_window_s:
        return replace(watch, figures=figures)
    seen = (
        f"{figures['step_s_now']:.4g} s now, not <= {target:.4g} s"
        if fresh
        else "no newer step records of the job"
    )
    return replace(
        watch,
        phase="not recovered",
        figures=figures,
        why=(
            f"job {watch.job}'s step time did not recover within {cfg.rebalance_window_s:g} s "
            f"of rung a: {seen} (was {watch.step_s:.4g} s, {watch.step_s_without:.4g} s at "
            "its peers' pace)"
        ),
    )
