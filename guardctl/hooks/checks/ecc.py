"""Check ``ecc``: no uncorrectable (double-bit) ECC error since the driver loaded."""

from __future__ import annotations

from typing import Any

from guardctl.hooks.registry import CheckResult, Hook, HookContext, per_gpu, register

UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE = 0  # NVML_VOLATILE_ECC: since the last driver load


class Ecc:
    name = "ecc"
    hooks: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")

    def run(self, ctx: HookContext) -> CheckResult:
        def problem(handle: Any) -> str | None:
            # Raises where ECC is off or unsupported: that GPU is skipped.
            count = ctx.nvml.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, VOLATILE)
            return f"{count} uncorrectable ECC" if count > 0 else None

        return per_gpu(self.name, ctx, problem, "no uncorrectable ECC errors")


register(Ecc())
