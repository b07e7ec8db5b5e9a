"""Check ``gpu_count``: NVML sees as many GPUs as the node should have (a GPU fell off the bus)."""

from __future__ import annotations

from guardctl.hooks.registry import CheckResult, Hook, HookContext, register


class GpuCount:
    name = "gpu_count"
    hooks: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")

    def run(self, ctx: HookContext) -> CheckResult:
        expected = ctx.settings.sweep.hook_gpus
        handles, why = ctx.gpus()
        if why:
            if expected > 0:
                return CheckResult(self.name, False, f"expected {expected} GPUs, {why}")
            return CheckResult(self.name, True, why, skipped=True)
        if expected > 0 and len(handles) != expected:
            return CheckResult(self.name, False, f"{len(handles)} of {expected} GPUs visible")
        return CheckResult(self.name, True, f"{len(handles)} GPUs")


register(GpuCount())
