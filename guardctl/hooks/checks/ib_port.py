"""Check ``ib_port``: every InfiniBand port is ACTIVE at its full rate (no 400 -> 200 downshift).

Reads ``<agent.sysfs_root>/class/infiniband/<dev>/ports/<n>/{state,rate}``. A port
is slow when its rate is below ``sweep.hook_ib_min_rate_gbps`` or, with that at 0,
below the fastest port of the node.
"""

from __future__ import annotations

import re

from guardctl.hooks.registry import CheckResult, Hook, HookContext, register

_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def _read(path: object) -> str:
    try:
        return open(str(path), encoding="utf-8").read().strip()
    except OSError:
        return ""


class IbPort:
    name = "ib_port"
    hooks: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")

    def run(self, ctx: HookContext) -> CheckResult:
        base = ctx.sysfs / "class" / "infiniband"
        ports = sorted(base.glob("*/ports/*")) if base.is_dir() else []
        if not ports:
            return CheckResult(self.name, True, "no InfiniBand ports", skipped=True)
        rates, bad = {}, []
        for port in ports:
            label = f"{port.parent.parent.name}/{port.name}"
            state = _read(port / "state")  # "4: ACTIVE"
            if state.split(":")[-1].strip() != "ACTIVE":
                bad.append(f"ib {label} state {state.split(':')[-1].strip() or 'unreadable'}")
                continue
            m = _RATE.match(_read(port / "rate"))  # "400 Gb/sec (4X NDR)"
            if m:
                rates[label] = float(m.group(1))
        floor = ctx.settings.sweep.hook_ib_min_rate_gbps or max(rates.values(), default=0.0)
        bad += [
            f"ib {label} rate {r:g} Gb/s < {floor:g}" for label, r in rates.items() if r < floor
        ]
        if bad:
            return CheckResult(self.name, False, ", ".join(bad))
        return CheckResult(self.name, True, f"{len(ports)} port(s) active")


register(IbPort())
