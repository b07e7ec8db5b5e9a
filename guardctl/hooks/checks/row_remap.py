"""Check ``row_remap``: no GPU has a row remap pending (needs a reset) or a remap failure."""

from __future__ import annotations

from guardctl.hooks.registry import CheckResult, Hook, HookContext, register


class RowRemap:
    name = "row_remap"
    hooks: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")

    def run(self, ctx: HookContext) -> CheckResult:
        handles, why = ctx.gpus()
        if why:
            return CheckResult(self.name, True, why, skipped=True)
        bad = []
        for i, h in enumerate(handles):
            try:
                _corr, _unc, pending, failure = ctx.nvml.nvmlDeviceGetRemappedRows(h)
            except Exception:  # pre-Ampere GPUs have no row remapping
                continue
            if failure:
                bad.append(f"gpu{i} row remap failed")
            elif pending:
                bad.append(f"gpu{i} row remap pending (reset needed)")
        if bad:
            return CheckResult(self.name, False, ", ".join(bad))
        return CheckResult(self.name, True, "no row remap pending")


register(RowRemap())
