"""Running a hook: the checks, a drain through the node-action door, the epilog's summary.

Slurm runs hooks as root with no PATH and few variables: the node is
``SLURMD_NODENAME``, the job ``SLURM_JOB_ID``, its nodes ``SLURM_NODELIST``
(on 22.05 ``SLURM_JOB_NODELIST`` is empty there). A prolog or epilog that exits
non-zero makes Slurm drain the node itself (and requeue the job, held), outside
guardctl's cap and ownership. So a hook fails only where guardctl drained the node
itself, with the evidence; where guardctl does not (its cap is reached, Slurm or the
store cannot be reached, observe-only, or many nodes fail the same check at once: a
fleet-wide cause) the hook passes and raises an alert, unless
``hooks.fail_when_not_drained`` says otherwise. A failing prolog writes the reason to the
job's stderr file as the job's user, so the user reads why. Slurm is contacted only when a
check fails. Alerts and the epilog's straggler summary go to syslog (tag ``guardctl``, facility
daemon) as well as to stderr: Slurm keeps a hook's output only when the hook fails.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import statistics
import syslog
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from guardctl import runner
from guardctl.actionlog import Entry
from guardctl.config import Settings
from guardctl.errors import GuardctlError
from guardctl.hooks.registry import CheckResult, Hook, HookContext, checks, guarded
from guardctl.nodeops import NodeOps
from guardctl.nodes import expand, fold
from guardctl.sections.hooks import HooksSettings
from guardctl.storage import layout, store
from guardctl.telemetry import schema

STRAGGLER_RATIO = 1.10  # a node's median compute time this far above the job's median
# The epilog's straggler line reads the node files of the job's last hour.
LAST_HOUR_S = 3600.0
HOOK_FAILED = "hook failed"  # the action log's note of every failing hook run and its outcome
# Drain outcomes after which the node is guardctl's: the hook may fail the job.
_HELD = ("done", "no change")
TELL_TIMEOUT_S = 5.0  # writing the user's note: a hung filesystem must not hang the prolog
_NOT_A_FILE = 254  # the writing child's exit code for a path that is not a regular file


@dataclass
class HookReport:
    """What one hook run found and did."""

    hook: Hook
    node: str
    job: str
    results: list[CheckResult] = field(default_factory=list)
    drained: str = ""  # the drain reason set, or why the drain was not possible
    stragglers: str = ""  # epilog: the finished job's straggler summary
    fails: bool = False  # the hook exits 1 (guardctl drained the node, or a setting says so)
    alerts: list[str] = field(default_factory=list)  # what an operator must look at
    told_user: str = ""  # prolog: what became of the note in the job's stderr file

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def reason(self) -> str:
        return f"{self.hook}: " + "; ".join(r.message for r in self.failed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "hook": self.hook,
            "node": self.node,
            "job": self.job,
            "ok": not self.failed,
            "fails": self.fails,
            "checks": [r.as_dict() for r in self.results],
            "drained": self.drained,
            "stragglers": self.stragglers,
            "alerts": self.alerts,
            "told_user": self.told_user,
        }


def node_name(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run_hook(
    settings: Settings,
    hook: Hook,
    *,
    environ: Mapping[str, str] | None = None,
    node: str = "",
    nvml: Any = None,
    dry_run: bool = False,
    ops: NodeOps | None = None,
) -> HookReport:
    """Run *hook*'s checks on this node; drain it through guardctl when one fails."""
    env = os.environ if environ is None else environ
    ctx = HookContext(settings, node or node_name(env), nvml=nvml)
    report = HookReport(hook, ctx.node, env.get("SLURM_JOB_ID", ""))
    report.results = [guarded(c, ctx) for c in checks(hook)]
    report.alerts = [
        f"check {r.check} could not run: {r.message}"
        for r in report.results
        if r.skipped and r.message.startswith("check error")
    ]
    if hook == "epilog" and report.job:
        report.stragglers = straggler_summary(settings.store.root, report.job, _job_nodes(env))
    if report.failed:
        report.drained, held = _drain(settings, report, dry_run, ops)
        report.fails = held or settings.hooks.fail_when_not_drained
        if not held:
            then = (
                "exiting 1 (hooks.fail_when_not_drained): Slurm drains the node itself"
                if report.fails
                else "passing: the node stays in service"
            )
            report.alerts.append(f"{report.reason()}; {report.drained}; {then}")
        if hook == "prolog" and report.fails and not dry_run:
            report.told_user = tell_user(env, report)
    if not dry_run:
        for alert in report.alerts:
            _syslog(f"guardctl {hook} {report.node}: {alert}")
        if report.stragglers:  # Slurm keeps an epilog's output only when the epilog fails
            _syslog(f"guardctl {hook} {report.node}: {report.stragglers}", syslog.LOG_INFO)
    return report


def _drain(
    settings: Settings, report: HookReport, dry_run: bool, ops: NodeOps | None
) -> tuple[str, bool]:
    """Drain the node through the door; returns what happened and whether the node is
    guardctl's now (only then may the hook fail: Slurm would drain it otherwise)."""
    why = store.unmarked(settings.store.root)
    if why:
        return f"not drained by guardctl: {why}", False
    evidence = {
        "hook": report.hook,
        "job": report.job,
        "checks": [r.as_dict() for r in report.failed],
    }
    try:
        ops = ops or NodeOps(settings)
        # Under the action lock, so that hooks failing on many nodes at once count each other.
        with ops.locked():
            entries = ops.log.entries()
            burst = fleet_burst(entries, report, settings.hooks, ops.clock())
            if burst:
                outcome, held, news = f"not drained by guardctl: {burst}", False, True
            else:
                outcome, held, news = _drain_one(ops, report, dry_run, evidence)
            if (
                news
                and not dry_run
                and not _noted_lately(entries, report, held, settings.hooks, ops.clock())
            ):
                ops.record(
                    HOOK_FAILED,
                    [report.node],
                    reason=report.reason(),
                    evidence={**evidence, "drained": held, "outcome": outcome},
                )
    except GuardctlError as exc:  # the store or Slurm could not be read or written
        return f"not drained by guardctl: {exc}", False
    return outcome, held


def _drain_one(
    ops: NodeOps, report: HookReport, dry_run: bool, evidence: dict[str, Any]
) -> tuple[str, bool, bool]:
    """What the drain did, whether the node is guardctl's now, and whether that is news (a
    node guardctl drained before, failing again, is not: it is not noted, nor counted in a
    burst, every time its health check runs)."""
    try:
        actions = ops.drain([report.node], report.reason(), dry_run=dry_run, evidence=evidence)
    except GuardctlError as exc:  # held by someone else, the cap, the rate limit, Slurm
        return f"not drained by guardctl: {exc}", False, True
    held = bool(actions) and all(
        a.outcome in _HELD or (dry_run and a.outcome == "would do") for a in actions
    )
    news = not actions or any(a.outcome != "no change" for a in actions)
    text = "; ".join(f"{a.outcome}: {a.message}" for a in actions)
    if not held:
        text = f"not drained by guardctl: {text or 'no action'}"
    return text, held, news


def fleet_burst(
    entries: Sequence[Entry], report: HookReport, cfg: HooksSettings, now: float
) -> str:
    """Why this failure is part of a fleet-wide one ("" when it is not): at least
    ``burst_nodes`` nodes, this one included, failed one of its checks within the window."""
    failing = {r.check for r in report.failed}
    nodes: dict[str, set[str]] = {name: {report.node} for name in failing}
    for entry in entries:
        if entry.action != HOOK_FAILED or entry.ts < now - cfg.burst_window_s:
            continue
        for check in entry.evidence.get("checks") or ():
            name = check.get("check") if isinstance(check, dict) else None
            if name in nodes:
                nodes[str(name)].update(entry.nodes)
    for name, found in sorted(nodes.items()):
        if len(found) >= cfg.burst_nodes:
            return (
                f"fleet-wide: {len(found)} nodes ({fold(found)}) failed "
                f"the {name} check within {cfg.burst_window_s:g} s: a cause common to the "
                "fleet (a configuration push, a driver, the fabric), not node faults"
            )
    return ""


def _noted_lately(
    entries: Sequence[Entry], report: HookReport, held: bool, cfg: HooksSettings, now: float
) -> bool:
    # A node that keeps failing undrained (a health check every few minutes, every job's
    # prolog) is noted once per window: enough for the burst count, and the log stays small.
    if held:
        return False
    checks_now = sorted(r.check for r in report.failed)
    return any(
        e.action == HOOK_FAILED
        and report.node in e.nodes
        and e.ts >= now - cfg.burst_window_s
        and not e.evidence.get("drained")
        and sorted(
            str(c.get("check")) for c in e.evidence.get("checks") or () if isinstance(c, dict)
        )
        == checks_now
        for e in entries
    )


def _syslog(line: str, priority: int = syslog.LOG_WARNING) -> None:
    # The line also reaches the site's log collection, where slurmd's log may not.
    syslog.openlog("guardctl", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(priority, line)


# -- the note to the user -----------------------------------------------------------------

# Slurm's filename patterns (sbatch(1) "filename pattern"): %% and those this node knows for
# certain from the prolog's environment. The others (%N, %n, %t, %s, %J, %b) depend on the node
# or the step that writes the file: such a path is not guessed at.
_PATTERN = re.compile(r"%(\d*)(.)")


def expand_path(raw: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """The job's stderr path with Slurm's patterns expanded, or ("", why not)."""
    if not raw.startswith("/"):
        return "", "the path is not absolute"
    if "\\" in raw:
        return "", "the path has a backslash (Slurm does not expand such a path)"
    job = environ.get("SLURM_JOB_ID", "")
    values = {
        "%": "%",
        "j": job,
        "A": environ.get("SLURM_ARRAY_JOB_ID") or job,
        "a": environ.get("SLURM_ARRAY_TASK_ID", ""),
        "u": environ.get("SLURM_JOB_USER", ""),
        "x": environ.get("SLURM_JOB_NAME", ""),
    }
    unknown: list[str] = []

    def expand(match: re.Match[str]) -> str:
        width, key = match.group(1), match.group(2)
        value = values.get(key, "")
        if not value:
            unknown.append(match.group(0))
            return ""
        return value.zfill(int(width)) if width and value.isdigit() else value

    path = _PATTERN.sub(expand, raw)
    if unknown:
        return "", f"guardctl cannot expand {', '.join(unknown)} on this node"
    return path, ""


def tell_user(environ: Mapping[str, str], report: HookReport) -> str:
    """Append the reason to the job's stderr file as the job's user; say what became of it.

    The file is opened by a child that has dropped to the job's uid, gid and groups, with
    O_NOFOLLOW and O_NONBLOCK, and written only if it is a regular file: the user's own rights,
    never root's, and no symlink, FIFO or device. Its owner is never changed.
    """
    raw = environ.get("SLURM_JOB_STDERR") or environ.get("SLURM_JOB_STDOUT") or ""
    if not raw:
        return "not written: Slurm named no stderr file; the reason is the node's drain reason"
    path, why = expand_path(raw, environ)
    uid, gid = environ.get("SLURM_JOB_UID", ""), environ.get("SLURM_JOB_GID", "")
    if not why and not (uid.isdigit() and gid.isdigit()):
        why = "Slurm gave no SLURM_JOB_UID and SLURM_JOB_GID"
    if why:
        return f"not written to {raw}: {why}; the reason is the node's drain reason"
    line = (
        f"guardctl: job {report.job} was requeued: node {report.node} failed the prolog "
        f"checks ({report.reason()}); the node is drained. Slurm holds a job requeued after a "
        f"prolog failure: 'scontrol release {report.job}' lets it run elsewhere\n"
    )
    work = partial(append_line, path, line.encode())
    if os.geteuid() == 0:
        code = runner.as_user(
            int(uid),
            int(gid),
            _groups(environ.get("SLURM_JOB_USER", ""), int(gid)),
            work,
            timeout=TELL_TIMEOUT_S,
        )
    elif os.geteuid() == int(uid):
        code = work()
    else:
        return f"not written to {path}: guardctl runs as neither root nor the job's user"
    if code == 0:
        return f"written to {path}"
    what = {
        -1: "timed out",
        _NOT_A_FILE: "not a regular file",
        runner.AS_USER_FAILED: "could not act as the job's user",
    }.get(code) or os.strerror(code)
    return f"not written to {path}: {what}; the reason is the node's drain reason"


def _groups(user: str, gid: int) -> list[int]:
    """The job user's supplementary groups (a group-writable project directory), or its gid."""
    if user:
        try:
            return os.getgrouplist(user, gid)
        except (KeyError, OSError):
            pass
    return [gid]


def append_line(path: str, data: bytes) -> int:
    """Append *data* to *path* without following a symlink or blocking on a FIFO: 0, or the
    errno (``_NOT_A_FILE`` for anything but a regular file). System calls only: it runs in
    the forked child of :func:`guardctl.runner.as_user`."""
    flags = (
        os.O_WRONLY
        | os.O_APPEND
        | os.O_CREAT
        | os.O_NOFOLLOW
        | os.O_NONBLOCK
        | os.O_NOCTTY
        | os.O_CLOEXEC
    )
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        return exc.errno or errno.EIO
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _NOT_A_FILE
        os.write(fd, data)
    except OSError as exc:
        return exc.errno or errno.EIO
    finally:
        os.close(fd)
    return 0


def _job_nodes(env: Mapping[str, str]) -> list[str]:
    try:
        return expand(env.get("SLURM_JOB_NODELIST") or "") if env.get("SLURM_JOB_NODELIST") else []
    except GuardctlError:  # not a node list: the summary reads what the ranks wrote themselves
        return []


def straggler_summary(root: Path, job: str, nodes: Sequence[str] = ()) -> str:
    """One line on the finished job's slowest node, from its probe step records.

    Ranks without an agent wrote them under ``steps/<job>/``; ranks that handed them to their
    node's agent are in the node files of the job's *nodes* (the segments of its last hour,
    whatever their length).
    """
    try:
        directory = layout.steps_dir(root) / job
    except ValueError:
        return ""
    paths = [directory] if directory.is_dir() else []
    now = time.time()
    for node in nodes:
        try:
            paths += layout.node_files(root, node, now - LAST_HOUR_S, now)
        except ValueError:  # not a node's name
            continue
    if not paths:
        return ""
    per_node: dict[str, list[float]] = defaultdict(list)
    for rec in (r for path in paths for r in schema.read_path(path).records):
        value = rec.get("compute_s", rec.get("step_s"))
        if rec.get("kind") == "step" and rec.get("job") == job and isinstance(value, int | float):
            per_node[rec["node"]].append(float(value))
    if len(per_node) < 2:
        return f"job {job}: step records from {len(per_node)} node(s), nothing to compare"
    medians = {n: statistics.median(v) for n, v in per_node.items()}
    middle = statistics.median(medians.values())
    slow = sorted(
        (n for n, m in medians.items() if m > STRAGGLER_RATIO * middle), key=lambda n: -medians[n]
    )
    if not slow:
        return f"job {job}: no straggler among {len(medians)} nodes"
    worst = slow[0]
    return (
        f"job {job}: straggler(s) {', '.join(slow)}; slowest {worst} compute "
        f"{medians[worst]:.3g} s vs job median {middle:.3g} s"
    )
