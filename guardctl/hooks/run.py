"""Running a hook: the checks, a drain through the node-action door, the epilog's summary.

Slurm runs hooks as root with no PATH and few variables: the node is
``SLURMD_NODENAME``, the job ``SLURM_JOB_ID``, its nodes ``SLURM_NODELIST``
(on 22.05 ``SLURM_JOB_NODELIST`` is empty there). A prolog that exits non-zero
makes Slurm requeue the job (held) and drain the node; guardctl drains first so
the reason is guardctl's, with the evidence, and writes it to the job's stderr
file so the user reads why. Slurm is contacted only when a check fails.
"""

from __future__ import annotations

import os
import socket
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl import layout
from guardctl.config import Settings
from guardctl.errors import GuardctlError
from guardctl.hooks.registry import CheckResult, Hook, HookContext, checks, guarded
from guardctl.nodeops import NodeOps
from guardctl.telemetry import schema

STRAGGLER_RATIO = 1.10  # a node's median compute time this far above the job's median


@dataclass
class HookReport:
    """What one hook run found and did."""

    hook: Hook
    node: str
    job: str
    results: list[CheckResult] = field(default_factory=list)
    drained: str = ""  # the drain reason set, or why the drain was not possible
    stragglers: str = ""  # epilog: the finished job's straggler summary

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def reason(self) -> str:
        return f"{self.hook}: " + "; ".join(r.message for r in self.failed)

    def as_dict(self) -> dict[str, Any]:
        return {"hook": self.hook, "node": self.node, "job": self.job,
                "ok": not self.failed, "checks": [r.as_dict() for r in self.results],
                "drained": self.drained, "stragglers": self.stragglers}


def node_name(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run_hook(settings: Settings, hook: Hook, *, environ: Mapping[str, str] | None = None,
             node: str = "", nvml: Any = None, dry_run: bool = False,
             ops: NodeOps | None = None) -> HookReport:
    """Run *hook*'s checks on this node; drain it through guardctl when one fails."""
    env = os.environ if environ is None else environ
    ctx = HookContext(settings, node or node_name(env), nvml=nvml)
    report = HookReport(hook, ctx.node, env.get("SLURM_JOB_ID", ""))
    report.results = [guarded(c, ctx) for c in checks(hook)]
    if hook == "epilog" and report.job:
        report.stragglers = straggler_summary(settings.store.root, report.job)
    if report.failed:
        report.drained = _drain(settings, report, dry_run, ops)
        if hook == "prolog":
            tell_user(env, report)
    return report


def _drain(settings: Settings, report: HookReport, dry_run: bool,
           ops: NodeOps | None) -> str:
    evidence = {"hook": report.hook, "job": report.job,
                "checks": [r.as_dict() for r in report.failed]}
    try:
        ops = ops or NodeOps(settings)
        actions = ops.drain([report.node], report.reason(), dry_run=dry_run, evidence=evidence)
    except GuardctlError as exc:
        # Someone else holds the node, or the cap is reached: the prolog still fails the job.
        return f"not drained by guardctl: {exc}"
    return "; ".join(f"{a.outcome}: {a.message}" for a in actions)


def tell_user(environ: Mapping[str, str], report: HookReport) -> None:
    """Append the reason to the job's stderr file, as the job's owner, when Slurm named one."""
    path = environ.get("SLURM_JOB_STDERR") or environ.get("SLURM_JOB_STDOUT")
    if not path or "%" in path or not Path(path).parent.is_dir():
        return
    line = (f"guardctl: job {report.job} was requeued: node {report.node} failed the prolog "
            f"checks ({report.reason()}); the node is drained. Slurm holds a job requeued after a "
            f"prolog failure: 'scontrol release {report.job}' lets it run elsewhere\n")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            uid, gid = environ.get("SLURM_JOB_UID", ""), environ.get("SLURM_JOB_GID", "")
            if os.geteuid() == 0 and uid.isdigit() and gid.isdigit():
                os.fchown(fd, int(uid), int(gid))
        finally:
            os.close(fd)
    except OSError:
        pass  # the user's directory is not writable here: Slurm's drain reason still says it


def straggler_summary(root: Path, job: str) -> str:
    """One line on the finished job's slowest node, from its probe step records."""
    try:
        directory = layout.steps_dir(root) / job
    except ValueError:
        return ""
    if not directory.is_dir():
        return ""
    result = schema.read_path(directory)
    per_node: dict[str, list[float]] = defaultdict(list)
    for rec in result.records:
        value = rec.get("compute_s", rec.get("step_s"))
        if rec.get("kind") == "step" and isinstance(value, int | float):
            per_node[rec["node"]].append(float(value))
    if len(per_node) < 2:
        return f"job {job}: step records from {len(per_node)} node(s), nothing to compare"
    medians = {n: statistics.median(v) for n, v in per_node.items()}
    middle = statistics.median(medians.values())
    slow = sorted((n for n, m in medians.items() if m > STRAGGLER_RATIO * middle),
                  key=lambda n: -medians[n])
    if not slow:
        return f"job {job}: no straggler among {len(medians)} nodes"
    worst = slow[0]
    return (f"job {job}: straggler(s) {', '.join(slow)}; slowest {worst} compute "
            f"{medians[worst]:.3g} s vs job median {middle:.3g} s")
