"""Check ``ecc``: no uncorrectable (double-bit) ECC error since the driver loaded."""

from __future__ import annotations

from guardctl.hooks.registry import CheckResult, Hook, HookContext, register

UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE = 0  # NVML_VOLATILE_ECC: since the last driver load


class Ecc:
    name = "ecc"
    hooks: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")

    def run(self, ctx: HookContext) -> CheckResult:
        handles, why = ctx.gpus()
        if why:
            return CheckResult(self.name, True, why, skipped=True)
        bad = []
        for i, h in enumerate(handles):
            try:
                count = ctx.nvml.nvmlDeviceGetTotalEccErrors(h, UNCORRECTED, VOLATILE)
            except Exception:  # ECC off or not supported on this board: nothing to check
                continue
            if count > 0:
                bad.append(f"gpu{i} {count} uncorrectable ECC")
        if bad:
            return CheckResult(self.name, False, ", ".join(bad))
        return CheckResult(self.name, True, "no uncorrectable ECC errors")


register(Ecc())
