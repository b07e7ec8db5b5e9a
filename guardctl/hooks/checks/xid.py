"""Check ``xid``: no hardware XID reported for this node's GPUs recently.

XIDs come from the node agent's telemetry (``gpu`` records' ``xid`` field) in
the shared store: the agent watches NVML's event stream all the time, a hook
cannot. Application XIDs (13, 31, 43, 45: a program's fault) are not node faults.
"""

from __future__ import annotations

from collections import Counter

from guardctl.hooks.registry import CheckResult, Hook, HookContext, register
from guardctl.storage import layout
from guardctl.telemetry import schema

# Hardware / driver XIDs: memory (48, 63, 64, 92, 94, 95), NVLink (74), bus (79),
# GSP/firmware (119, 120), fatal (61, 62, 140).
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})


class Xid:
    name = "xid"
    hooks: tuple[Hook, ...] = ("prolog", "epilog", "healthcheck")

    def run(self, ctx: HookContext) -> CheckResult:
        window = ctx.settings.sweep.hook_xid_window_s
        since = ctx.now - window
        try:
            files = layout.node_files(ctx.settings.store.root, ctx.node, since, ctx.now)
        except ValueError:  # not a node's name: no agent writes for it
            files = []
        seen: Counter[str] = Counter()
        bad = Counter[str]()
        for path in files:
            for rec in schema.iter_file(path, bad):
                if rec.get("kind") != "gpu" or rec.get("xid") is None or rec["ts"] < since:
                    continue
                if rec["xid"] in HARDWARE_XIDS:
                    seen[f"gpu{rec['gpu']} XID {rec['xid']}"] += 1
        if not files:
            return CheckResult(
                self.name, True, f"no agent telemetry for this node in {window:g} s", skipped=True
            )
        if seen:
            return CheckResult(
                self.name, False, ", ".join(sorted(seen)) + f" in the last {window:g} s"
            )
        return CheckResult(self.name, True, "no hardware XID")


register(Xid())
