"""The default Slurm backend: Slurm's own commands, run through guardctl.runner.

Reads use JSON where the installed release has it (``sinfo --json`` /
``squeue --json`` on 22.05, ``scontrol --json`` from 23.02); reservations on
22.05 come from ``scontrol show -o``. From 24.11 the JSON is asked for in a pinned
data_parser version: the newest one that both the release and guardctl know
(:data:`DATA_PARSERS`; tests/fixtures/ holds each captured); a release that does not
ship it is read with its default ``--json`` instead. Where the JSON cannot carry every
node flag (BLOCKED before data_parser v0.0.44), the flags of ``scontrol show -o node``
are added to the nodes read. Every command has a timeout; a timeout or
"Unable to contact slurm controller" becomes :class:`SlurmUnavailable`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from guardctl import runner
from guardctl.errors import SlurmError, SlurmUnavailable
from guardctl.nodes import fold
from guardctl.sections.slurm import SlurmSettings
from guardctl.slurm import parse
from guardctl.slurm.job import signal_name
from guardctl.slurm.types import JobInfo, NodeInfo, ReservationInfo, SubmitRequest
from guardctl.topology import Topology

T = TypeVar("T")
# (first release that has it, data_parser plugin), newest first: a release is asked for the
# newest plugin it has (--json=<plugin>), so that no state it can report is lost to an older
# format (v0.0.42 drops BLOCKED, which 26.05 reports in v0.0.44+). A newer release still
# ships the last of these for a while (each release keeps the three before its own).
DATA_PARSERS = (
    ((26, 5), "v0.0.45"),
    ((25, 11), "v0.0.44"),
    ((25, 5), "v0.0.43"),
    ((24, 11), "v0.0.42"),
)
# Before this release no data_parser carries BLOCKED (24.11 knows the state, shows it only
# in text): node flags are then also read from `scontrol show -o node`.
JSON_SHOWS_EVERY_NODE_FLAG = (25, 11)
_DEFAULT_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin")
# Words Slurm clients print when the controller does not answer.
_UNREACHABLE = (
    "unable to contact slurm controller",
    "connection refused",
    "socket timed out",
    "communication connection failure",
    "slurm_load_jobs error",  # followed by one of the above on some releases
    "zero bytes were transmitted or received",
)


class CliSlurm:
    """A :class:`guardctl.slurm.types.SlurmClient` over sinfo, squeue, scontrol, sbatch, scancel."""

    def __init__(self, settings: SlurmSettings, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        env = dict(os.environ if environ is None else environ)
        if settings.conf:
            env["SLURM_CONF"] = settings.conf
        self.env = env
        self._pin_failed = False  # the pinned data_parser was refused: use the default

    # -- running -------------------------------------------------------------------------
    def _binary(self, name: str) -> str:
        if self.settings.bin_dir:
            path = Path(self.settings.bin_dir) / name
            if path.is_file():
                return str(path)
            raise SlurmError(f"{name} not found in slurm.bin_dir {self.settings.bin_dir}")
        for directory in _DEFAULT_DIRS:
            candidate = Path(directory) / name
            if candidate.is_file():
                return str(candidate)
        found = shutil.which(name, path=self.env.get("PATH"))
        if not found:
            raise SlurmError(f"{name} not found: is Slurm installed? (set slurm.bin_dir)")
        return found

    def _run(self, name: str, *args: str, extra_env: Mapping[str, str] | None = None) -> str:
        argv = [self._binary(name), *args]
        env = {**self.env, **extra_env} if extra_env else self.env
        try:
            result = runner.run(argv, timeout=self.settings.timeout_s, env=env)
        except runner.CommandTimeout:
            raise SlurmUnavailable(
                f"{name} did not answer within {self.settings.timeout_s:g} s "
                "(is slurmctld running?)"
            ) from None
        except runner.CommandNotFound as exc:
            raise SlurmError(str(exc)) from None
        except runner.CommandFailed as exc:
            raise self._classify(name, exc.result.stderr if exc.result else str(exc)) from None
        # `sinfo --json` exits 0 with an "Unspecified error" when the controller is down; only
        # its stderr says why.
        if any(word in result.stderr.lower() for word in _UNREACHABLE):
            raise self._classify(name, result.stderr)
        return result.stdout

    @staticmethod
    def _classify(name: str, stderr: str) -> SlurmError:
        lowered = stderr.lower()
        detail = " ".join(stderr.split())[:300] or "no error message"
        if any(word in lowered for word in _UNREACHABLE):
            return SlurmUnavailable(f"{name}: Slurm controller not reachable: {detail}")
        return SlurmError(f"{name} failed: {detail}")

    @cached_property
    def version(self) -> tuple[int, int]:
        return parse.version_from_text(self._run("sinfo", "--version"))

    @property
    def _modern(self) -> bool:
        return self.version >= (23, 2)

    def controller_up(self) -> bool:
        """Ask ``scontrol ping`` whether the controller answers."""
        try:
            out = self._run("scontrol", "ping")
        except SlurmError:
            return False
        return "is UP" in out

    @property
    def json_flag(self) -> str:
        """``--json=<pinned data_parser>`` where the release has one, else ``--json``."""
        if self._pin_failed:
            return "--json"
        plugin = next((p for first, p in DATA_PARSERS if self.version >= first), None)
        return f"--json={plugin}" if plugin else "--json"

    def _json_text(self, name: str, *args: str) -> str:
        """Run a JSON read (``--json`` goes first, before *args*), falling back from the pinned
        data_parser to the release's default when the release does not ship that plugin."""
        flag = self.json_flag
        try:
            return self._run(name, flag, *args)
        except SlurmError as exc:
            if flag == "--json" or "data_parser" not in str(exc):
                raise
        self._pin_failed = True
        return self._run(name, "--json", *args)

    def _read_json(self, parser: Callable[[str], list[T]], name: str, *args: str) -> list[T]:
        text = self._json_text(name, *args)
        try:
            return parser(text)
        except SlurmError as exc:
            # 22.05's `sinfo --json` reports a dead controller only as "Unspecified error".
            if not self.controller_up():
                raise SlurmUnavailable(
                    f"{name}: Slurm controller not reachable (scontrol ping: DOWN)"
                ) from None
            raise exc from None

    # -- reads ---------------------------------------------------------------------------
    def nodes(self) -> list[NodeInfo]:
        if not self._modern:
            return self._read_json(parse.nodes_from_json, "sinfo")
        nodes = self._read_json(parse.nodes_from_json, "scontrol", "show", "nodes")
        if self.version < JSON_SHOWS_EVERY_NODE_FLAG:
            # A flag the JSON cannot show must still keep the node out of "in service".
            text = self._run("scontrol", "show", "-o", "node")
            nodes = parse.with_flags_from_text(nodes, text)
        return nodes

    def jobs(self) -> list[JobInfo]:
        return self._read_json(parse.jobs_from_json, "squeue")

    def recent_jobs(self) -> list[JobInfo]:
        # --states=all: 22.05's `squeue --json` lists the ended jobs anyway, 26.05's only with
        # it (seen in the lab); their start and end say where they ran when.
        return self._read_json(parse.jobs_from_json, "squeue", "--states=all")

    def reservations(self) -> list[ReservationInfo]:
        if self._modern:
            return parse.reservations_from_json(self._json_text("scontrol", "show", "reservations"))
        return parse.reservations_from_text(self._run("scontrol", "show", "-o", "reservation"))

    def topology(self) -> Topology | None:
        # Text on every release: 24.11 and 26.05 accept --json here but print the same text.
        try:
            text = self._run("scontrol", "show", "topology")
        except SlurmError as exc:
            if parse.NO_TOPOLOGY in str(exc).lower():
                return None
            raise
        return parse.topology_from_text(text)

    # -- actions -------------------------------------------------------------------------
    def drain(self, nodes: Sequence[str], reason: str) -> None:
        if not reason.strip():
            raise SlurmError("a drain needs a reason")  # scontrol refuses it anyway
        self._run(
            "scontrol", "update", f"NodeName={fold(nodes)}", "State=DRAIN", f"Reason={reason}"
        )

    def resume(self, nodes: Sequence[str]) -> None:
        self._run("scontrol", "update", f"NodeName={fold(nodes)}", "State=RESUME")

    def create_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        users: Sequence[str],
        flags: Sequence[str] = ("MAINT", "IGNORE_JOBS"),
    ) -> None:
        self._run(
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={_check_word(name)}",
            f"Nodes={fold(nodes)}",
            f"Users={','.join(_check_word(u) for u in users)}",
            "StartTime=now",
            "Duration=infinite",
            f"Flags={','.join(_check_word(f) for f in flags)}",
        )

    def delete_reservation(self, name: str) -> None:
        self._run("scontrol", "delete", f"ReservationName={_check_word(name)}")

    def submit(self, request: SubmitRequest) -> int:
        args = ["--parsable", f"--job-name={request.job_name}"]
        if request.nodes:
            args += [f"--nodelist={fold(request.nodes)}", f"--nodes={len(request.nodes)}"]
        elif request.node_count:
            args.append(f"--nodes={request.node_count}")
        if request.reservation:
            args.append(f"--reservation={_check_word(request.reservation)}")
        if request.partition:
            args.append(f"--partition={_check_word(request.partition)}")
        if request.time_limit_min:
            args.append(f"--time={int(request.time_limit_min)}")
        if request.ntasks_per_node:
            args.append(f"--ntasks-per-node={int(request.ntasks_per_node)}")
        if request.output:
            args.append(f"--output={request.output}")
        if request.env:
            for key in request.env:
                _check_word(key)
            args.append("--export=ALL," + ",".join(request.env))
        args += list(request.extra)
        out = self._run("sbatch", *args, request.script, *request.args, extra_env=request.env)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch returned no job id: {out.strip()!r}")
        return int(job_id)

    def cancel(self, job_id: int) -> None:
        self._run("scancel", str(int(job_id)))

    # -- one job ---------------------------------------------------------------------------
    def job(self, job_id: int) -> JobInfo | None:
        # squeue --json ignores -j on 22.05 (and fails on a forgotten id on newer releases):
        # read the queue and pick the job out; with the ended jobs, whose final state and exit
        # code 24.11+ lists only with --states=all.
        wanted = int(job_id)
        return next((j for j in self.recent_jobs() if j.job_id == wanted), None)

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._run("scontrol", "requeuehold" if hold else "requeue", str(int(job_id)))

    def release_hold(self, job_id: int) -> None:
        self._run("scontrol", "release", str(int(job_id)))

    def update_job(self, job_id: int, *, exclude: Sequence[str]) -> None:
        self._run(
            "scontrol",
            "update",
            f"JobId={int(job_id)}",
            f"ExcNodeList={fold(exclude) if exclude else ''}",
        )

    def signal(self, job_id: int, signal: str) -> None:
        # --full: the batch script too, not only its steps (a training launcher traps USR1).
        self._run("scancel", "--full", f"--signal={signal_name(signal)}", str(int(job_id)))


_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _check_word(text: str) -> str:
    # Reservation, user, partition, flag and variable names end up inside Key=Value words.
    if not _WORD.match(text):
        raise SlurmError(f"invalid Slurm name {text!r}")
    return text
