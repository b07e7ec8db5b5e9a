"""Check ``row_remap``: no GPU has a row remap pending (needs a reset) or a remap failure."""

from __future__ import annotations

from typing import Any

from guardctl.hooks.registry import CheckResult, Hook, HookContext, per_gpu, register


class RowRemap:
    name = "row_remap"
    hooks: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")

    def run(self, ctx: HookContext) -> CheckResult:
        def problem(handle: Any) -> str | None:
            # Raises on pre-Ampere GPUs, which have no row remapping: that GPU is skipped.
            _corr, _unc, pending, failure = ctx.nvml.nvmlDeviceGetRemappedRows(handle)
            if failure:
                return "row remap failed"
            return "row remap pending (reset needed)" if pending else None

        return per_gpu(self.name, ctx, problem, "no row remap pending")


register(RowRemap())
