"""The hook check interface, what a check reports, and the registry of checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from guardctl.config import Settings
from guardctl.plugins import Registry

Hook = Literal["prolog", "epilog", "healthcheck"]
HOOKS: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``ok`` False means the node must not run jobs."""

    check: str
    ok: bool
    message: str
    skipped: bool = False  # nothing to check here (no NVIDIA driver, no InfiniBand)

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "ok": self.ok,
            "skipped": self.skipped,
            "message": self.message,
        }


@dataclass
class HookContext:
    """What checks read: settings, the node, NVML (pynvml, or a fake in tests), sysfs."""

    settings: Settings
    node: str
    nvml: Any = None  # the pynvml module; None: import it on first use
    now: float = field(default_factory=time.time)
    _nvml_state: str = ""  # "" not tried, "ok", or why NVML is unusable

    @property
    def sysfs(self) -> Path:
        return Path(self.settings.agent.sysfs_root)

    def gpus(self) -> tuple[list[Any], str]:
        """NVML device handles, or ([], why) when there is no usable NVIDIA driver."""
        if not self._nvml_state:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            try:
                self.nvml.nvmlInit()
                self._nvml_state = "ok"
            except Exception as exc:  # NVMLError_LibraryNotFound and friends
                name = type(exc).__name__
                self._nvml_state = (
                    "no NVIDIA driver" if "LibraryNotFound" in name else f"NVML unusable ({name})"
                )
        if self._nvml_state != "ok":
            return [], self._nvml_state
        count = self.nvml.nvmlDeviceGetCount()
        return [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)], ""


class Check(Protocol):
    name: str
    hooks: tuple[Hook, ...]  # which hooks run it

    def run(self, ctx: HookContext) -> CheckResult: ...


CHECKS: Registry[Check] = Registry("check", "guardctl.hooks.checks")


def per_gpu(
    name: str, ctx: HookContext, problem: Callable[[Any], str | None], healthy: str
) -> CheckResult:
    """Run *problem* on every GPU handle: it returns what is wrong with that GPU, or None.

    A GPU on which the NVML call raises (the feature is off or absent on that board) is
    skipped; no NVML at all makes the whole check skipped, with the reason.
    """
    handles, why = ctx.gpus()
    if why:
        return CheckResult(name, True, why, skipped=True)
    bad = []
    for i, handle in enumerate(handles):
        try:
            found = problem(handle)
        except Exception:  # not supported on this board: nothing to check
            continue
        if found:
            bad.append(f"gpu{i} {found}")
    if bad:
        return CheckResult(name, False, ", ".join(bad))
    return CheckResult(name, True, healthy)


def register(check: Check) -> Check:
    """Add *check* (called at the bottom of its module)."""
    return CHECKS.add(check.name, check)


def checks(hook: Hook) -> list[Check]:
    return [c for _, c in sorted(CHECKS.items()) if hook in c.hooks]


def guarded(check: Check, ctx: HookContext) -> CheckResult:
    """Run *check*; a check that crashes reports it instead of stopping the others."""
    try:
        return check.run(ctx)
    except Exception as exc:
        return CheckResult(
            check.name, True, f"check error, ignored: {type(exc).__name__}: {exc}", skipped=True
        )


CheckFn = Callable[[HookContext], CheckResult]
