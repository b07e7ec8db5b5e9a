"""Running a sweep: quarantine the suspects, run the sweep jobs, judge, then drain or release.

Steps, all through :class:`guardctl.nodeops.NodeOps` so that ownership, caps
and the action log hold:

1. quarantine every node (its own MAINT,IGNORE_JOBS reservation): running jobs
   finish, production jobs wait, sweep jobs run with ``--reservation``;
2. single-node sweeps (gemm, nccl) on each node in its quarantine reservation;
3. multi-node sweeps (pairwise): a job may name one reservation only, so each
   group (suspects plus known-good partners) gets a short-lived sweep
   reservation over all its nodes (MAINT lets it overlap the quarantine ones),
   made through the door too (partners in service, their own cap, the rate
   limit, an intent naming this process so a crash leaks nothing); the pairing
   strategy chooses the groups round after round;
4. a failure is repeated ``sweep.repeat_failures`` times before it counts,
   against the reference of the first attempt;
5. pass: release; fail: drain with the evidence as reason; passing figures
   update the baselines. Results go to ``<store>/sweeps/<sweep id>/``.
   Only a figure below its reference fails: a job that did not run to a
   measurement (cancelled, NODE_FAIL, its program missing, pending until
   ``sweep.job_timeout_s``, no GPU backend) leaves its node *undetermined*:
   kept quarantined, the verdict saying why; it is not repeated here (the
   controller retries it later, bounded).

Known-good partners are idle in-service nodes that are not current suspects
(at fault in the controller's newest pass, held quarantined or swept by it, or
decided for within ``control.flap_window_s``: :func:`suspects_in_log`), nor any
node the caller names in :attr:`SweepOptions.avoid`. With a network tree (``[control] racks``
or Slurm's topology plugin) they are chosen by leaf (:func:`by_leaf`) and the pairing tells a
node from its link and its switches (:mod:`guardctl.sweep.fabric`): a switch at fault gives its
suspects the verdict ``fabric`` and the report's ``fabric`` names it; no node is drained for it.

On an error or Ctrl-C the submitted jobs are cancelled, sweep reservations
deleted, and the nodes stay quarantined (safe) for the operator to decide.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import guardctl
from guardctl import testhooks
from guardctl.actionlog import Entry
from guardctl.analyze.fabric import FabricFinding
from guardctl.config import Settings
from guardctl.controller.ladder import derive
from guardctl.errors import RefusedError, SlurmError, StoreError, UsageError
from guardctl.fileio import atomic_write
from guardctl.nodeops import NodeOps
from guardctl.slurm.job import Job, wait_all
from guardctl.storage import layout
from guardctl.sweep import backend, baseline, fabric, pairing
from guardctl.sweep.judge import (
    Judgement,
    Reference,
    configured_for,
    floored,
    judge_all,
    references,
)
from guardctl.sweep.registry import JobSpec, Measurement, SweepPlugin, get, names
from guardctl.topology import Topology, load_topology, split_component

Kind = Literal["single", "multi", "all"]
# fabric: failed only with partners whose traffic crossed a faulty switch or uplink (the
# report's ``fabric`` names it); the node itself is not shown at fault and is never drained.
Verdict = Literal["pass", "fail", "undetermined", "fabric"]
Progress = Callable[[str], None]
MAX_GOOD_PARTNERS = 4  # idle nodes borrowed as known-good partners at most
# With a network tree: partners on the suspects' own leaves and on others, up to this many.
MAX_GOOD_PARTNERS_BY_LEAF = 8
PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class SweepOptions:
    """What the operator asked for."""

    kind: Kind = "all"
    duration_s: float | None = None  # None: sweep.gemm_duration_s
    dry_run: bool = False
    # False for the controller's lemon: a pass keeps it quarantined until its drain, so that no
    # job lands on it in between.
    release_passed: bool = True
    # Never known-good partners: the controller's current suspects (a partner that is slow
    # itself would fail its group and blame the node swept).
    avoid: frozenset[str] = frozenset()


@dataclass
class NodeVerdict:
    """The outcome for one node and what was done about it."""

    node: str
    verdict: Verdict
    evidence: str
    action: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "node": self.node,
            "verdict": self.verdict,
            "evidence": self.evidence,
            "action": self.action,
        }


@dataclass
class SweepReport:
    """Everything a sweep did; written to results.json and printed by the CLI."""

    sweep_id: str
    kind: Kind
    nodes: list[str]
    dry_run: bool
    started: float
    finished: float = 0.0
    directory: str = ""
    actions: list[dict[str, str]] = field(default_factory=list)
    planned: list[dict[str, Any]] = field(default_factory=list)
    judgements: list[Judgement] = field(default_factory=list)
    verdicts: list[NodeVerdict] = field(default_factory=list)
    pairing: dict[str, Any] = field(default_factory=dict)
    baselines_learnt: list[str] = field(default_factory=list)
    # Fabric components the pairwise tests convicted (FabricFinding.as_dict() each).
    fabric: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether any node did not pass (failed, or undetermined: an operator must look)."""
        return any(v.verdict != "pass" for v in self.verdicts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id,
            "kind": self.kind,
            "nodes": self.nodes,
            "dry_run": self.dry_run,
            "started": self.started,
            "finished": self.finished,
            "directory": self.directory,
            "verdicts": [v.as_dict() for v in self.verdicts],
            "actions": self.actions,
            "planned": self.planned,
            "judgements": [j.as_dict() for j in self.judgements],
            "pairing": self.pairing,
            "baselines_learnt": self.baselines_learnt,
            "fabric": self.fabric,
        }


def scripts_dir(settings: Settings) -> Path:
    """Where the sbatch scripts and burn-in programs are (config, source tree, or share/)."""
    candidates = (
        [Path(settings.sweep.scripts_dir)]
        if settings.sweep.scripts_dir
        else [
            Path(guardctl.__file__).resolve().parent.parent / "sweeps",
            Path(sys.prefix) / "share" / "guardctl" / "sweeps",
            Path("/usr/share/guardctl/sweeps"),
        ]
    )
    for path in candidates:
        if (path / "gemm.sbatch").is_file():
            return path
    raise UsageError(
        f"sweep job scripts not found in {', '.join(map(str, candidates))}; set sweep.scripts_dir"
    )


def new_sweep_id(now: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)


UNMEASURABLE = "sweep_undetermined"  # the record a sweep program prints when it cannot measure


def unmeasurable(text: str) -> str:
    """Why a sweep program said it could not measure (no GPU backend, say), or ""."""
    for line in text.splitlines():
        if UNMEASURABLE not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("kind") == UNMEASURABLE:
            return str(rec.get("why") or "the sweep program could not measure")
    return ""


class SweepPending(Exception):
    """A polled sweep's batch of jobs has not ended yet: poll again later."""


@dataclass
class _Submitted:
    """A polled sweep's job, kept from poll to poll (by its tag)."""

    job: Job
    at: float  # when its batch was submitted (wall clock)
    timed_out: bool = False


@dataclass
class _SweepJob:
    """One sweep job: the plugin that built it, what it was asked, the Slurm job running it."""

    plugin: SweepPlugin
    spec: JobSpec
    job: Job | None = None
    timed_out: bool = False  # still running at sweep.job_timeout_s: cancelled

    @property
    def state(self) -> str:
        if self.timed_out:
            return "TIMEOUT"
        return self.job.state if self.job is not None else ""


class SweepRun:
    """One sweep in progress: submits batches of jobs, waits, parses and judges."""

    def __init__(
        self,
        settings: Settings,
        ops: NodeOps,
        report: SweepReport,
        duration_s: float,
        progress: Progress,
        *,
        polled: bool = False,
        topology: Topology | None = None,
    ) -> None:
        self.settings, self.ops, self.report = settings, ops, report
        self.topology = topology
        self.cfg = settings.sweep
        self.duration_s = duration_s
        self.progress = progress
        # Polled (the controller's daemon): a batch is submitted and SweepPending raised; each
        # poll replays the sweep from the top (the same specs, tags and reservation names, as
        # the counter starts again at 0), reading the ended batches' jobs kept here.
        self.polled = polled
        self.submitted: dict[str, _Submitted] = {}
        self.reserved: dict[str, str] = {}  # sweep reservation asked -> made ("": deleted)
        self.said: set[str] = set()
        self.out_dir = Path(report.directory)
        self.scripts = scripts_dir(settings)
        self.baselines = baseline.values(settings.store.root)
        self.counter = 0
        # Slurm's Gres, so that a job on a GPU node knows it must find them (no CPU fallback).
        self.gpus = {n.name: backend.gres_gpus(n.gres) for n in ops.slurm.nodes()}
        env = {
            "GUARDCTL_PYTHON": self.cfg.python or sys.executable,
            "GUARDCTL_SWEEPS_DIR": str(self.scripts),
        }
        self.env = env

    def say(self, message: str) -> None:
        """Progress, once per message when polled (each poll replays what was said before)."""
        if self.polled and message in self.said:
            return
        self.said.add(message)
        self.progress(message)

    # -- jobs ------------------------------------------------------------------------------
    def spec(
        self, plugin: SweepPlugin, nodes: Sequence[str], reservation: str, attempt: int
    ) -> JobSpec:
        self.counter += 1
        who = "+".join(nodes) if len(nodes) <= 3 else f"{nodes[0]}+{len(nodes) - 1}"
        options = {
            k: getattr(self.cfg, k)
            for k in (
                "gemm_size",
                "gemm_threads",
                "allreduce_max_bytes",
                "allreduce_iters",
                "cpu_tasks",
                "nccl_tests",
                "gpus_per_node",
            )
        }
        gpus = backend.job_gpus(self.gpus, nodes)
        env = {**self.env, backend.NODE_GPUS_ENV: str(gpus)} if gpus else dict(self.env)
        injected = injected_factors(self.cfg.inject, tuple(nodes), self.topology)
        if injected:
            env[testhooks.INJECT_ENV] = ",".join(f"{n}={f:g}" for n, f in injected.items())
        return JobSpec(
            nodes=tuple(nodes),
            reservation=reservation,
            out_dir=self.out_dir,
            tag=f"{self.counter:03d}-{plugin.name}-{who}-a{attempt}",
            duration_s=self.duration_s,
            scripts_dir=self.scripts,
            python=self.env["GUARDCTL_PYTHON"],
            time_limit_min=max(1, math.ceil(self.cfg.job_timeout_s / 60)),
            partition=self.cfg.partition,
            env=env,
            options=options,
        )

    def run_batch(
        self, batch: list[tuple[SweepPlugin, Sequence[str], str]], attempt: int
    ) -> list[list[Measurement]]:
        """Submit every (plugin, nodes, reservation) at once, wait, return each job's figures."""
        jobs = [_SweepJob(p, self.spec(p, nodes, resv, attempt)) for p, nodes, resv in batch]
        if self.polled:
            return self._polled_batch(jobs, attempt)
        try:
            self._submit(jobs, attempt)
            self._wait(jobs)
        except BaseException:
            self._cancel([j.job for j in jobs if j.job is not None and not j.job.ended])
            raise
        return [self._measurements(j) for j in jobs]

    def _submit(self, jobs: list[_SweepJob], attempt: int) -> None:
        for sj in jobs:
            sj.job = Job.submit(self.ops.slurm, sj.plugin.build(sj.spec), tag=sj.spec.tag)
        self.ops.record(
            "sweep jobs",
            sorted({n for j in jobs for n in j.spec.nodes}),
            evidence={
                "sweep": self.report.sweep_id,
                "attempt": attempt,
                "jobs": {str(j.job.job_id): j.spec.tag for j in jobs if j.job is not None},
            },
        )

    def _polled_batch(self, jobs: list[_SweepJob], attempt: int) -> list[list[Measurement]]:
        """Submit the batch and raise SweepPending; at later polls, its figures once it ended
        (jobs still running at sweep.job_timeout_s are cancelled, as a waiting sweep does)."""
        kept = [self.submitted.get(j.spec.tag) for j in jobs]
        if not any(kept):
            try:
                self._submit(jobs, attempt)
            except BaseException:
                self._cancel([j.job for j in jobs if j.job is not None])
                raise
            now = time.time()
            self.submitted.update(
                {j.spec.tag: _Submitted(j.job, now) for j in jobs if j.job is not None}
            )
            self.say(
                f"sweep {self.report.sweep_id}: submitted "
                + ", ".join(j.spec.tag for j in jobs[:4])
                + (f" (+{len(jobs) - 4} more)" if len(jobs) > 4 else "")
            )
            raise SweepPending
        held = [k for k in kept if k is not None]
        running = wait_all([k.job for k in held], timeout_s=0, poll_s=self.cfg.poll_interval_s)
        if running and time.time() - min(k.at for k in held) < self.cfg.job_timeout_s:
            raise SweepPending
        self._cancel(running)
        for late in held:
            late.timed_out = late.timed_out or any(late.job is r for r in running)
        for sj, got in zip(jobs, kept, strict=True):
            if got is not None:
                sj.job, sj.timed_out = got.job, got.timed_out
        return [self._measurements(j) for j in jobs]

    def cancel_all(self) -> None:
        """Cancel every job of this polled sweep that has not ended (an abort)."""
        self._cancel([k.job for k in self.submitted.values() if not k.job.ended])

    def _wait(self, jobs: list[_SweepJob]) -> None:
        def note(done: int, total: int, running: list[Job]) -> None:
            states = ", ".join(f"{j.tag} {j.state.lower()}" for j in running[:4] if j.state)
            self.progress(
                f"sweep {self.report.sweep_id}: {done}/{total} jobs done"
                + (f"; {states}" if states else "")
            )

        running = wait_all(
            [j.job for j in jobs if j.job is not None],
            timeout_s=self.cfg.job_timeout_s,
            poll_s=self.cfg.poll_interval_s,
            progress=note,
            progress_every_s=PROGRESS_EVERY_S,
        )
        self._cancel(running)
        late = {j.job_id for j in running}
        for sj in jobs:
            sj.timed_out = sj.job is not None and sj.job.job_id in late

    def _cancel(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            try:
                job.cancel()
            except Exception as exc:  # keep cancelling the others, say which one stayed
                self.progress(f"could not cancel job {job.job_id}: {exc}")

    def _measurements(self, job: _SweepJob) -> list[Measurement]:
        path = job.spec.output()
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        found = job.plugin.parse(text, job.spec.nodes)
        if found:
            return found
        why = unmeasurable(text) or self._no_result(job)
        return [
            Measurement(
                job.plugin.name,
                job.spec.nodes,
                "node" if len(job.spec.nodes) == 1 else "group",
                "",
                0.0,
                f"{job.plugin.name}|error",
                error=f"{why}; see {path.name}",
            )
        ]

    def _no_result(self, job: _SweepJob) -> str:
        """Why a job left no figure, from what Slurm said of it: its state and exit code."""
        job_id = job.job.job_id if job.job is not None else 0
        last = job.job.info if job.job is not None else None
        if job.timed_out and last is not None and last.state == "PENDING":
            return (
                f"no result (job {job_id} still pending ({last.reason or 'no reason'}) at "
                f"sweep.job_timeout_s={self.cfg.job_timeout_s:g}, cancelled)"
            )
        why = f"no result (job {job_id} {job.state.lower() or 'unknown'}"
        code = job.job.exit_code if job.job is not None and not job.timed_out else None
        return why + (f", exit {code})" if code is not None else ")")

    # -- judging -----------------------------------------------------------------------------
    def _refs(self, found: Sequence[Measurement]) -> dict[str, Reference]:
        return references(found, self.baselines, self.cfg.references)

    def _judge(
        self, found: Sequence[Measurement], refs: dict[str, Reference], attempt: int = 1
    ) -> list[Judgement]:
        return judge_all(found, refs, self.cfg.tolerance, attempt, self.cfg.references)

    # -- single-node sweeps ------------------------------------------------------------------
    def single(self, nodes: Sequence[str]) -> list[Judgement]:
        plugins = [get(n) for n in names("single")]
        batch: list[tuple[SweepPlugin, Sequence[str], str]] = [
            (p, (n,), self.ops.reservation_name(n)) for n in nodes for p in plugins
        ]
        found = self.run_batch(batch, attempt=1)
        flat = [m for ms in found for m in ms]
        refs = self._refs(flat)
        judged = self._judge(flat, refs)
        for attempt in range(2, 2 + self.cfg.repeat_failures):
            failing = {(j.measurement.sweep, j.measurement.nodes) for j in judged if j.failed}
            if not failing:
                break
            self.say(
                f"repeating {len(failing)} failed sweep(s) before they count: "
                + ", ".join(f"{s} {'+'.join(n)}" for s, n in sorted(failing))
            )
            again = self.run_batch(
                [(get(s), n, self.ops.reservation_name(n[0])) for s, n in sorted(failing)], attempt
            )
            retried = [m for ms in again for m in ms]
            # The same reference as the first attempt: a rerun alone has no fleet to compare to.
            new_refs = {**self._refs(retried), **refs}
            judged = [
                j for j in judged if (j.measurement.sweep, j.measurement.nodes) not in failing
            ] + self._judge(retried, new_refs, attempt)
        return judged

    # -- multi-node sweeps -------------------------------------------------------------------
    def multi(
        self, suspects: Sequence[str], goods: Sequence[str]
    ) -> tuple[list[Judgement], pairing.Outcome]:
        plugin = get("pairwise")
        judged: dict[pairing.Group, Judgement] = {}
        known_good: dict[str, Reference] = {}
        if len(goods) >= 2:  # without a baseline, a group of known-good nodes is the reference
            ref_group = reference_group(goods, suspects, self.cfg.partners, self.topology)
            ms = self._groups(plugin, [ref_group], attempt=0)[0]
            for m in ms:
                if not m.error and not m.wrong and m.key not in self.baselines:
                    known_good[m.key] = floored(
                        Reference(
                            m.value, "known-good group", f"{'+'.join(ref_group)}, no baseline"
                        ),
                        configured_for(m.key, self.cfg.references),
                    )

        def oracle(groups: list[pairing.Group]) -> list[bool | None]:
            found = [m for ms in self._groups(plugin, groups, 1) for m in ms]
            refs = {**self._refs(found), **known_good}
            results = self._judge(found, refs)
            for attempt in range(2, 2 + self.cfg.repeat_failures):
                failing = [j.measurement.nodes for j in results if j.failed]
                if not failing:
                    break
                self.say(f"repeating {len(failing)} failed group(s) before they count")
                again = [m for ms in self._groups(plugin, failing, attempt) for m in ms]
                results = [j for j in results if j.measurement.nodes not in failing] + self._judge(
                    again, {**self._refs(again), **refs}, attempt
                )
            for j in results:
                judged[j.measurement.nodes] = j
            return [
                None if g not in judged or judged[g].undetermined else judged[g].passed
                for g in groups
            ]

        outcome = pairing.find_bad(
            self.cfg.pairing,
            list(suspects),
            list(goods),
            oracle,
            group_size=self.cfg.group_size,
            partners=self.cfg.partners,
            topology=self.topology,
        )
        return list(judged.values()), outcome

    def _groups(
        self, plugin: SweepPlugin, groups: Sequence[pairing.Group], attempt: int
    ) -> list[list[Measurement]]:
        """Run one job per group, each in its own sweep reservation over the group's nodes.

        The reservations go through the node-action door (ownership of the partners, cap,
        rate limit, intent first), and a crash leaves nothing the next command cannot delete.
        """
        base = self.cfg.reservation_prefix + self.report.sweep_id.replace("-", "_")
        names: list[str] = []
        pending = False
        try:
            batch: list[tuple[SweepPlugin, Sequence[str], str]] = []
            for group in groups:
                name = f"{base}_{self.counter + len(names) + 1}"
                if name not in self.reserved:  # polled: made at an earlier poll (or deleted)
                    self.reserved[name] = self.ops.reserve_for_sweep(
                        group, self.report.sweep_id, name
                    )
                names.append(name)
                batch.append((plugin, group, self.reserved[name] or name))
            return self.run_batch(batch, attempt)
        except SweepPending:
            pending = True  # its jobs run in them: kept until a later poll sees them end
            raise
        finally:
            if not pending:
                self.unreserve(names)

    def unreserve(self, names: Sequence[str] | None = None) -> bool:
        """Delete the sweep reservations *names* (all still held: None); True when all went."""
        ok = True
        for name in self.reserved if names is None else names:
            resv = self.reserved.get(name)
            if not resv:
                continue
            try:
                self.ops.unreserve(resv)
                self.reserved[name] = ""
            except Exception as exc:  # keep deleting the others; the operator must know
                ok = False
                self.progress(f"could not delete sweep reservation {resv}: {exc}")
        return ok


def suspects_in_log(entries: Sequence[Entry], since: float) -> set[str]:
    """The controller's current suspects, as its action log tells them: the nodes at fault in
    its newest pass, those it holds quarantined or sweeps, and those it decided anything but
    "none" or "leave" for (a watch, rung a, a hold-off) at or after *since*."""
    at_fault: set[str] = set()
    for e in reversed(entries):
        if e.action == "control pass":
            at_fault = set(e.nodes)
            break
    held = {n for n, lad in derive(entries).items() if lad.quarantined_by_control or lad.sweeping}
    decided = {
        n
        for e in entries
        if e.action == "control decision"
        and e.ts >= since
        and e.evidence.get("decision") not in ("none", "leave")
        for n in e.nodes
    }
    return at_fault | held | decided


def _good_partners(
    ops: NodeOps,
    settings: Settings,
    suspects: Sequence[str],
    avoid: frozenset[str] = frozenset(),
    tree: Topology | None = None,
) -> list[str]:
    """Known-good partners: never a node swept, nor a current suspect (*avoid*, and the
    controller's suspects in the action log)."""
    # A decision within the flap window is a current suspect's (the window flapping counts in).
    since = ops.clock() - settings.control.flap_window_s
    avoid = avoid | suspects_in_log(ops.log.entries(), since)
    if settings.sweep.good_nodes:
        goods = list(settings.sweep.good_nodes)
        overlap = set(goods) & set(suspects)
        if overlap:
            raise UsageError(f"sweep.good_nodes includes swept node(s): {', '.join(overlap)}")
        suspect = sorted(set(goods) & avoid)
        if suspect:
            raise RefusedError(
                f"sweep.good_nodes: partner(s) {', '.join(suspect)} are current "
                "suspects of the controller, not known-good; nothing was changed"
            )
        # Unknown names are a usage error; a partner must be in service and held by no one.
        busy = {s.name: s.reason or s.owner for s in ops.status(goods) if s.owner != "in service"}
        if busy:
            detail = "; ".join(f"{n}: {why}" for n, why in busy.items())
            raise RefusedError(
                f"sweep.good_nodes: partner(s) not in service ({detail}); nothing was changed"
            )
        return goods
    idle = [
        s.name
        for s in ops.status()
        if s.owner == "in service"
        and s.slurm_state == "idle"
        and s.name not in suspects
        and s.name not in avoid
    ]
    if tree is not None:
        # Partners are held at once by a round's tests: never more than the cap allows.
        return by_leaf(idle, suspects, tree)[: settings.safety.max_sweep_partners]
    return idle[:MAX_GOOD_PARTNERS]


def by_leaf(idle: Sequence[str], suspects: Sequence[str], tree: Topology) -> list[str]:
    """Partners that can tell a suspect from its leaf and its uplink: one on each suspect's
    leaf, then one on each other leaf, nearest first (the same spine group, then farther);
    then a second on each; up to MAX_GOOD_PARTNERS_BY_LEAF."""
    near = {tree.leaf_of(n) for n in suspects}
    paths = [set(tree.path(s)) for s in suspects if tree.path(s)]

    def distance(node: str) -> tuple[int, int]:
        path = tree.path(node)
        if not path or path[0] in near:
            return (0, 0)
        return (1, -max((len(set(path) & p) for p in paths), default=0))

    ranked = sorted(idle, key=lambda n: (distance(n), n))
    chosen: list[str] = []
    per_leaf: dict[str | None, int] = {}
    for tier in range(2):
        for node in ranked:
            leaf = tree.leaf_of(node)
            if node in chosen or per_leaf.get(leaf, 0) != tier:
                continue
            per_leaf[leaf] = tier + 1
            chosen.append(node)
    return chosen[:MAX_GOOD_PARTNERS_BY_LEAF]


def reference_group(
    goods: Sequence[str], suspects: Sequence[str], partners: int, tree: Topology | None
) -> tuple[str, ...]:
    """The known-good nodes whose all-reduce is the reference when no baseline is learnt: with
    a tree, nodes of one leaf that holds no suspect (a faulty switch above the suspects must
    not set the bar), else the first partners."""
    size = 1 + partners
    if tree is not None:
        away = {tree.leaf_of(n) for n in suspects}
        by_leaf: dict[str, list[str]] = {}
        for node in goods:
            leaf = tree.leaf_of(node)
            if leaf is not None and leaf not in away:
                by_leaf.setdefault(leaf, []).append(node)
        fit = [nodes[:size] for _, nodes in sorted(by_leaf.items()) if len(nodes) >= size]
        if fit:
            return tuple(fit[0])
    return tuple(goods[:size])


def injected_factors(
    inject: dict[str, float], nodes: tuple[str, ...], tree: Topology | None
) -> dict[str, float]:
    """The lab-only slowdowns a sweep job over *nodes* runs with: a node's own (``node3``), and
    a fabric component's (``leaf:s2``, ``uplink:s2``, ``spine:s0``, ``link:node3``) when the
    job's traffic goes through it (a single-node job's never). A component slows the first of
    the job's nodes beneath it only: an all-reduce runs at its slowest rank's pace, and two
    slowed ranks would wait out each other's delay in turn."""
    out: dict[str, float] = {}
    through = fabric.carried(nodes, tree) if tree is not None and len(nodes) > 1 else frozenset()
    for name, factor in inject.items():
        kind, sep, switch = name.partition(":")
        if not sep:
            hit = [name] if name in nodes else []
        elif name not in through or tree is None:
            hit = []
        else:
            beneath = {switch} if kind == "link" else set(tree.nodes_under(switch))
            hit = [n for n in nodes if n in beneath][:1]
        for node in hit:
            out[node] = min(factor, out.get(node, 1.0))
    return dict(sorted(out.items()))


def _verdicts(
    nodes: Sequence[str], judged: Sequence[Judgement], outcome: pairing.Outcome | None
) -> list[NodeVerdict]:
    """Fail on a figure below its reference; else undetermined where a sweep of the node
    measured nothing (or a pairwise failure could not be isolated); else pass."""
    out = []
    for node in nodes:
        fails = [
            j
            for j in judged
            if j.failed and node in j.measurement.nodes and j.measurement.sweep != "pairwise"
        ]
        if outcome is not None and node in outcome.bad:
            fails += [
                j
                for j in judged
                if j.failed and j.measurement.sweep == "pairwise" and j.measurement.nodes[0] == node
            ]
        unmeasured = [
            j
            for j in judged
            if j.undetermined
            and node in j.measurement.nodes
            and (
                j.measurement.sweep != "pairwise"
                or (outcome is not None and node in outcome.undetermined)
            )
        ]
        behind = sorted(c for c, ns in (outcome.fabric if outcome else {}).items() if node in ns)
        if fails:
            out.append(NodeVerdict(node, "fail", fails[0].evidence + _more(fails)))
        elif behind:
            out.append(
                NodeVerdict(
                    node,
                    "fabric",
                    f"sweep pairwise: slow only through {', '.join(behind)}, with partners "
                    "chosen by leaf; the node itself is not shown at fault",
                )
            )
        elif unmeasured:
            out.append(
                NodeVerdict(
                    node,
                    "undetermined",
                    f"undetermined: {unmeasured[0].evidence}{_more(unmeasured)}",
                )
            )
        elif outcome is not None and node in outcome.undetermined:
            out.append(
                NodeVerdict(
                    node,
                    "undetermined",
                    "undetermined: sweep pairwise: failed in a group, no "
                    "known-good partner left to isolate it",
                )
            )
        else:
            out.append(NodeVerdict(node, "pass", "all sweeps passed"))
    return out


SETTLE = {
    "leaf": "check leaf switch {s} (port counters, logs); then sweep two of its nodes together "
    "and one of them with a node on another leaf",
    "uplink": "check the uplink ports and cables of leaf {s}; then sweep one of its nodes with a "
    "node on another leaf",
    "spine": "check switch {s} and its links; then sweep nodes of two leaves beneath it together",
    "link": "reseat or replace the cable and NIC of {s}; then sweep it with a node on its leaf",
}


def fabric_findings(
    outcome: pairing.Outcome, tree: Topology, goods: Sequence[str]
) -> list[FabricFinding]:
    """The switch-level components the pairwise tests convicted, with their case."""
    out = []
    for name in sorted(outcome.fabric):
        kind, switch = split_component(name)
        for_, against = fabric.finding_lines(outcome, tree, name)
        out.append(
            FabricFinding(
                component=name,
                kind=kind,
                nodes=tree.nodes_under(switch) if kind != "link" else (switch,),
                evidence_for=tuple(for_),
                evidence_against=tuple(against),
                confidence=fabric.confidence(outcome, tree, name, goods),
                settle=SETTLE[kind].format(s=switch),
            )
        )
    return out


def _more(judged: Sequence[Judgement]) -> str:
    return f" (+{len(judged) - 1} more)" if len(judged) > 1 else ""


def run_sweep(
    settings: Settings,
    nodes: Sequence[str],
    options: SweepOptions,
    *,
    ops: NodeOps | None = None,
    progress: Progress = lambda _msg: None,
) -> SweepReport:
    """Qualify *nodes*: quarantine, sweep, judge, then drain failures and release passes."""
    ops = ops or NodeOps(settings)
    report, goods, duration, tree = _prepare(settings, ops, nodes, options)
    if report.dry_run:
        return report
    _start(settings, ops, report, options, goods, duration)
    try:
        _execute(
            settings,
            ops,
            report,
            options,
            goods,
            SweepRun(settings, ops, report, duration, progress, topology=tree),
        )
    except BaseException as exc:
        _aborted(ops, report, f"{type(exc).__name__}: {exc}")
        raise
    return report


class PolledSweep:
    """A sweep that does not wait: :meth:`poll` submits its next batch of jobs, or judges and
    acts once its last batch ended, and returns at once (the controller's daemon polls it at
    each pass and watches the fleet in between).

    It keeps its jobs and its sweep reservations in memory, so only the process that started
    it can finish it: whoever finds it open in the action log after that process is gone
    aborts it (``guardctl.controller``). Its nodes stay quarantined through any abort.
    """

    def __init__(
        self,
        settings: Settings,
        nodes: Sequence[str],
        options: SweepOptions,
        *,
        ops: NodeOps,
        progress: Progress = lambda _msg: None,
    ) -> None:
        report, self.goods, duration, tree = _prepare(settings, ops, nodes, options)
        if report.dry_run:
            raise UsageError("a polled sweep acts: not in a dry run or observing only")
        self.settings, self.ops, self.report, self.options = settings, ops, report, options
        _start(settings, ops, report, options, self.goods, duration)  # its directory first
        try:
            self.run = SweepRun(
                settings, ops, report, duration, progress, polled=True, topology=tree
            )
        except BaseException as exc:
            _aborted(ops, report, f"{type(exc).__name__}: {exc}")
            raise

    def poll(self) -> SweepReport | None:
        """The report once the sweep is judged and acted on; None while jobs run. Any error
        aborts it (jobs cancelled, reservations deleted, nodes left quarantined) and is raised."""
        self.run.counter = 0  # the replay names every job and reservation as before
        try:
            _execute(self.settings, self.ops, self.report, self.options, self.goods, self.run)
        except SweepPending:
            return None
        except BaseException as exc:
            self.abort(f"{type(exc).__name__}: {exc}")
            raise
        return self.report

    def abort(self, why: str) -> bool:
        """Cancel its jobs, delete its sweep reservations, record it aborted; True when every
        reservation went (else call again: nothing may be leaked)."""
        self.run.cancel_all()
        gone = self.run.unreserve()
        if not self.report.finished:
            _aborted(self.ops, self.report, why)
        return gone


def _prepare(
    settings: Settings, ops: NodeOps, nodes: Sequence[str], options: SweepOptions
) -> tuple[SweepReport, list[str], float, Topology | None]:
    """Check the request and plan it (a dry run's report is complete here); nothing changes."""
    if not nodes:
        raise UsageError("no nodes to sweep")
    # Fault injection makes a healthy node fail its sweep and be drained: only on the lab.
    if settings.sweep.inject:
        testhooks.require_lab("sweep.inject", settings.slurm.conf)
    if os.environ.get(testhooks.INJECT_ENV):  # sbatch --export=ALL would hand it to the jobs
        testhooks.require_lab(testhooks.INJECT_ENV, settings.slurm.conf)
    duration = options.duration_s or settings.sweep.gemm_duration_s
    if duration <= 0:
        raise UsageError("--duration must be positive")
    now = time.time()
    report = SweepReport(
        new_sweep_id(now),
        options.kind,
        list(nodes),
        options.dry_run or settings.safety.observe_only,
        now,
    )
    drained = [s.name for s in ops.status(list(nodes)) if s.owner == "drained by guardctl"]
    if drained:
        raise UsageError(
            f"{', '.join(drained)}: drained by guardctl, a DRAIN blocks sweep jobs; "
            "resume it first (guardctl resume) to sweep it again"
        )
    goods: list[str] = []
    tree: Topology | None = None
    if options.kind in ("multi", "all"):
        tree, report.pairing["topology"] = _tree(settings, ops)
        goods = _good_partners(ops, settings, nodes, options.avoid, tree)
        if not goods and len(nodes) < 2:
            raise UsageError(
                "multi-node sweep: no idle in-service node to pair with; "
                "set sweep.good_nodes or use --kind single"
            )
    # Refusals (ownership, cap) come from a dry run first: nothing, not even the store, changes.
    planned_actions = ops.quarantine(list(nodes), f"sweep {report.sweep_id}", dry_run=True)
    if report.dry_run:
        report.actions = [a.as_dict() for a in planned_actions]
        report.planned = _plan(settings, ops, nodes, options.kind, goods, duration, tree)
        report.finished = time.time()
    return report, goods, duration, tree


def _tree(settings: Settings, ops: NodeOps) -> tuple[Topology | None, str]:
    """The network tree pairwise partners are chosen by, and a word on where it came from; a
    tree Slurm cannot give leaves the sweep to pair as without one (said in the report)."""
    try:
        tree = load_topology(ops.slurm, settings.control.racks)
    except SlurmError as exc:
        return None, f"none (Slurm's topology unreadable: {exc})"
    if tree is None:
        return None, "none (no [control] racks, no Slurm topology plugin)"
    return tree, tree.source


def _start(
    settings: Settings,
    ops: NodeOps,
    report: SweepReport,
    options: SweepOptions,
    goods: list[str],
    duration: float,
) -> None:
    """Its results directory, its nodes quarantined, "sweep started" in the action log."""
    directory = layout.sweep_dir(settings.store.root, report.sweep_id)
    try:
        directory.mkdir(parents=True, exist_ok=False)
        os.chmod(directory, 0o755)
    except OSError as exc:
        raise StoreError(f"cannot create {directory}: {exc.strerror}") from None
    report.directory = str(directory)
    reason = f"sweep {report.sweep_id}"
    report.actions = [
        a.as_dict()
        for a in ops.quarantine(report.nodes, reason, evidence={"sweep": report.sweep_id})
    ]
    ops.record(
        "sweep started",
        report.nodes,
        reason=reason,
        evidence={
            "sweep": report.sweep_id,
            "kind": options.kind,
            "duration_s": duration,
            "good_partners": goods,
        },
    )


def _aborted(ops: NodeOps, report: SweepReport, why: str) -> None:
    ops.record(
        "sweep aborted",
        report.nodes,
        reason=why,
        evidence={"sweep": report.sweep_id, "left": "quarantined"},
    )
    report.finished = time.time()
    _write_results(report)


def _execute(
    settings: Settings,
    ops: NodeOps,
    report: SweepReport,
    options: SweepOptions,
    goods: list[str],
    run: SweepRun,
) -> None:
    kind = options.kind
    nodes = report.nodes
    judged: list[Judgement] = []
    outcome: pairing.Outcome | None = None
    if kind in ("single", "all"):
        judged += run.single(nodes)
    if kind in ("multi", "all"):
        failed_single = {n for j in judged if not j.passed for n in j.measurement.nodes}
        suspects = [n for n in nodes if n not in failed_single]
        if suspects:
            pair_judged, outcome = run.multi(suspects, goods)
            judged += pair_judged
            report.pairing = {
                **report.pairing,
                "strategy": "by topology" if outcome.fabric_aware else settings.sweep.pairing,
                "rounds": outcome.rounds,
                "tests": outcome.tests,
                "good_partners": goods,
                "history": [
                    [{"nodes": list(g), "passed": ok} for g, ok in r] for r in outcome.history
                ],
            }
    report.judgements = judged
    if outcome is not None and run.topology is not None:
        report.fabric = [f.as_dict() for f in fabric_findings(outcome, run.topology, goods)]
    report.verdicts = _verdicts(nodes, judged, outcome)
    _act(ops, report, options.release_passed)
    if settings.sweep.learn_baselines:
        passed = {v.node for v in report.verdicts if v.verdict == "pass"}
        good = [
            j.measurement
            for j in judged
            if j.passed
            and set(j.measurement.nodes) <= (passed | set(goods))
            and not j.measurement.error
        ]
        learnt = baseline.learn(
            settings.store.root,
            good,
            sweep_id=report.sweep_id,
            keep=settings.sweep.baseline_history,
        )
        report.baselines_learnt = [b.key for b in learnt]
    report.finished = time.time()
    _write_results(report)
    ops.record(
        "sweep judged",
        nodes,
        reason=f"sweep {report.sweep_id}",
        evidence={
            "sweep": report.sweep_id,
            "verdicts": {v.node: v.verdict for v in report.verdicts},
        },
    )


def _act(ops: NodeOps, report: SweepReport, release_passed: bool) -> None:
    for v in report.verdicts:
        evidence = {"sweep": report.sweep_id}
        if v.verdict == "pass" and not release_passed:
            actions = []
            v.action = "kept quarantined"
        elif v.verdict == "pass":
            actions = ops.release([v.node], evidence=evidence)
            v.action = "released"
        elif v.verdict == "fail":
            actions = ops.drain([v.node], v.evidence, evidence=evidence)
            v.action = "drained"
        elif v.verdict == "fabric" and release_passed:
            # Its switch or uplink is at fault, not the node: never drained; the controller
            # records the component (and keeps jobs off its nodes only if so configured).
            actions = ops.release([v.node], evidence=evidence)
            v.action = "released"
        else:
            actions = []
            v.action = "kept quarantined"
        report.actions += [a.as_dict() for a in actions]


def _write_results(report: SweepReport) -> None:
    atomic_write(
        Path(report.directory) / baseline.RESULTS_FILE,
        json.dumps(report.as_dict(), indent=1, default=str) + "\n",
    )


def _plan(
    settings: Settings,
    ops: NodeOps,
    nodes: Sequence[str],
    kind: Kind,
    goods: Sequence[str],
    duration: float,
    tree: Topology | None = None,
) -> list[dict[str, Any]]:
    """What a real run would submit (multi-node: the first round only; later ones depend on
    it), each job with the program and backend it would run (:mod:`.backend`)."""
    gpus = {n.name: backend.gres_gpus(n.gres) for n in ops.slurm.nodes()}
    libs = backend.gpu_libraries(backend.sweep_python(settings))
    planned: list[dict[str, Any]] = []

    def job(sweep: str, members: Sequence[str]) -> dict[str, Any]:
        program, runs = backend.plan(sweep, backend.job_gpus(gpus, members), libs)
        return {"sweep": sweep, "nodes": list(members), "program": program, "backend": runs}

    if kind in ("single", "all"):
        for node in nodes:
            for sweep in names("single"):
                planned.append(
                    {
                        **job(sweep, [node]),
                        "duration_s": duration,
                        "reservation": f"{settings.quarantine.reservation_prefix}{node}",
                    }
                )
    if kind in ("multi", "all"):
        groups = pairing._chunks(list(nodes), settings.sweep.group_size)
        by_tree = tree is not None and len({tree.leaf_of(n) for n in [*nodes, *goods]}) > 1
        if tree is not None and by_tree:
            groups = [list(g) for g in fabric.screen(nodes, goods, tree, settings.sweep.partners)]
        for g in groups:
            members = g if len(g) > 1 else [*g, *goods[: settings.sweep.partners]]
            planned.append(
                {
                    **job("pairwise", members),
                    "round": 1,
                    "reservation": f"{settings.sweep.reservation_prefix}<sweep>_<n>",
                    "strategy": "by topology" if by_tree else settings.sweep.pairing,
                    "good_partners": list(goods),
                }
            )
    return planned
