"""Helpers for tests that need a real (local) Slurm cluster: the "lab".

A lab is one slurmctld plus N slurmd (node1..nodeN) on loopback, started by
``slurm/lab/up.sh --dir DIR`` and stopped by ``slurm/lab/down.sh --dir DIR``.
Everything of one lab lives under DIR, and every Slurm command must be run
with ``SLURM_CONF=DIR/slurm.conf`` -- use :attr:`Lab.env` or :meth:`Lab.sh`.
Several labs may run side by side on one machine (distinct ports and dirs).

``GUARDCTL_LAB_RELEASE`` (22.05, 24.11 or 26.05; default: the host's own Slurm)
picks the Slurm release of every lab a test session starts.  A release other
than the host's runs in a cached Debian root (``up.sh --release``); the host
then drives it through the lab's bin dir (:attr:`Lab.bin_dir`, first on
:attr:`Lab.env`'s PATH, and ``[slurm] bin_dir`` for guardctl), and the lab's
jobs run the root's Python (:func:`job_python`, :func:`job_guardctl`).

Jobs whose own behaviour a test checks (the probe, the data-sharding service) are submitted
as :data:`JOB_USER`, an ordinary user that up.sh creates: :meth:`Lab.user_workdir` and
``Lab.submit(..., as_user=workdir)``.

See slurm/lab/README.md.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
LAB_DIR = REPO_ROOT / "slurm" / "lab"
UP_SH = LAB_DIR / "up.sh"
DOWN_SH = LAB_DIR / "down.sh"
MARKER_PREFIX = "# guardctl-lab:"

#: Job states after which a job never changes again.
TERMINAL_JOB_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)

# Port bases are drawn from here: below the Linux ephemeral range (32768+),
# away from Slurm's 6817-6819 and the default lab's 16817+.
_PORT_LOW, _PORT_HIGH = 20000, 32000


RELEASES = ("22.05", "24.11", "26.05")
RELEASE_ENV = "GUARDCTL_LAB_RELEASE"


def host_release() -> str:
    """The host's Slurm release (``22.05``), or "" when Slurm is not installed.  Read from
    the package: a client whose SLURM_CONF names a missing file retries for 60 s."""
    if not shutil.which("dpkg-query"):
        return ""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", "slurm-client"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    match = re.match(r"(\d+\.\d+)", out)
    return match.group(1) if match else ""


def lab_release() -> str:
    """The release this session's labs run: $GUARDCTL_LAB_RELEASE, else the host's."""
    return os.environ.get(RELEASE_ENV, "").strip() or host_release() or RELEASES[0]


def in_root() -> bool:
    """True when the labs of this session run in a Debian root (not the host's Slurm)."""
    return lab_release() != (host_release() or RELEASES[0])


def job_python() -> str:
    """The Python that a lab's jobs and hooks run: the root's, or the one running the tests."""
    return "/usr/bin/python3" if in_root() else sys.executable


def job_guardctl() -> str:
    """The guardctl command that a lab's jobs and hooks run (up.sh installs one in a root)."""
    return "/usr/local/bin/guardctl" if in_root() else str(Path(sys.executable).parent / "guardctl")


#: The ordinary user that tests submit users' jobs as (slurm/lab/up.sh creates it): on a real
#: cluster no user's job runs as root, and what a job writes must work for its user.
JOB_USER = os.environ.get("GUARDCTL_LAB_JOB_USER", "guardctl-user")


def job_user_ids() -> tuple[int, int]:
    """The job user's uid and gid (KeyError before a lab has created it)."""
    entry = pwd.getpwnam(JOB_USER)
    return entry.pw_uid, entry.pw_gid


def let_job_user_run(program: str) -> None:
    """Let the job user reach *program* (e.g. a Python under /root, mode 0700): the search bit
    for others on each directory above it that lacks it, never the read bit."""
    for path in (Path(program), Path(program).resolve()):
        for parent in path.parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
                sys.stderr.write(
                    f"labtools: {parent} made searchable by others, so that "
                    f"{JOB_USER} can run {program}\n"
                )


class LabError(RuntimeError):
    """The lab could not be started, stopped or brought to a wanted state."""


class LabCommandError(subprocess.CalledProcessError):
    """A command run by Lab.sh() failed; str() shows its stderr too."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout!s:.2000}\nstderr: {self.stderr!s:.2000}"


def lab_unavailable_reason() -> str | None:
    """Why this machine cannot run a lab at all, or None if it can (try)."""
    if not hasattr(os, "geteuid") or not Path("/proc/self").exists():
        return "the Slurm lab needs Linux"
    if os.geteuid() != 0:
        return "the Slurm lab needs root (it starts munged, slurmctld and slurmd)"
    if not UP_SH.exists():
        return f"{UP_SH} is missing"
    have = all(
        shutil.which(b) or Path("/usr/sbin", b).exists()
        for b in ("slurmctld", "slurmd", "sinfo", "munged")
    )
    if not have and not shutil.which("apt-get"):
        return "slurm-wlm/munge are not installed and apt-get is unavailable"
    if lab_release() not in RELEASES:
        return f"{RELEASE_ENV}={lab_release()}: not one of {', '.join(RELEASES)}"
    if in_root() and not shutil.which("mmdebstrap"):
        return f"Slurm {lab_release()} needs a Debian root and mmdebstrap is not installed"
    return None


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _write_owner(home: Path) -> None:
    """Record the owning process (this one) so a later session can reap the
    lab if this process dies without tearing it down."""
    pid = os.getpid()
    (home / "owner").write_text(f"{pid} {_proc_start_time(pid)}\n")


def reap_stale_labs(root: str = "/tmp") -> list[Path]:
    """Stop labs under root/guardctl-lab-* whose owning process is gone
    (e.g. a test session that was killed); returns the reaped lab dirs."""
    reaped = []
    for home in Path(root).glob("guardctl-lab-*"):
        try:
            pid_s, start = (home / "owner").read_text().split()
            pid = int(pid_s)
        except (OSError, ValueError):
            continue
        if _proc_start_time(pid) == start:
            continue  # owner still alive
        subprocess.run(
            ["bash", str(DOWN_SH), "--dir", str(home), "--purge"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=False,
        )
        shutil.rmtree(home, ignore_errors=True)
        reaped.append(home)
    return reaped


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def find_free_port_base(count: int, tries: int = 200) -> int:
    """A base port B such that B..B+count-1 are all free to bind right now."""
    rng = random.SystemRandom()
    for _ in range(tries):
        base = rng.randrange(_PORT_LOW, _PORT_HIGH - count)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise LabError(f"no {count} consecutive free ports in {_PORT_LOW}-{_PORT_HIGH}")


def lab_env(
    conf: Path | str, base: dict[str, str] | None = None, bin_dir: Path | None = None
) -> dict[str, str]:
    """os.environ (or *base*) without Slurm job/client variables, plus SLURM_CONF
    (and the lab's bin dir first on PATH, for a lab in a Debian root)."""
    env = dict(os.environ if base is None else base)
    for key in list(env):
        if key.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_")):
            del env[key]
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def _pid_alive(pidfile: Path, comm: str) -> int | None:
    """The pid in *pidfile* if it is a live, non-zombie process named *comm*."""
    try:
        pid = int(pidfile.read_text().strip())
        if Path(f"/proc/{pid}/comm").read_text().strip() != comm:
            return None
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return None
    return pid


def _wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


@dataclass
class Lab:
    """A running lab instance.

    Attributes: ``dir`` (its home), ``conf`` (its slurm.conf), ``env`` (a copy
    of os.environ with SLURM_CONF set; pass it to any subprocess that runs a
    Slurm command), ``nodes`` (["node1", ...]), ``cluster``, ``port``
    (SlurmctldPort; the slurmd use port+1..port+N) and ``up_args`` (extra
    arguments that up.sh was started with, e.g. ``["--prolog", path]``),
    ``release`` (its Slurm release) and ``root`` (its Debian root, or None on
    the host's Slurm).
    """

    dir: Path
    conf: Path
    env: dict[str, str]
    nodes: list[str]
    cluster: str
    port: int
    up_args: list[str] = field(default_factory=list)
    release: str = ""
    root: Path | None = None
    _job_seq: int = field(default=0, repr=False)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def start(
        cls,
        dir: Path | str | None = None,
        *,
        nodes: int = 4,
        cluster: str | None = None,
        port: int | None = None,
        up_args: Sequence[str] = (),
        timeout: float = 900,
        attempts: int = 3,
    ) -> Lab:
        """Start a private lab under *dir* (default: a fresh /tmp/guardctl-lab-*).

        The port base is found by binding; if up.sh then fails because a port
        got taken meanwhile, it retries with other ports.  *timeout* covers
        an apt-get install on a bare machine.
        """
        if dir is None:
            dir = tempfile.mkdtemp(prefix="guardctl-lab-", dir="/tmp")
        home = Path(dir).resolve()
        home.mkdir(parents=True, exist_ok=True)
        _write_owner(home)
        cluster = cluster or "lab" + "".join(
            random.choices("abcdefghijkmnpqrstuvwxyz23456789", k=6)
        )
        last = ""
        for attempt in range(attempts):
            base = port if port is not None and attempt == 0 else find_free_port_base(nodes + 1)
            lab = cls(
                dir=home,
                conf=home / "slurm.conf",
                env=lab_env(home / "slurm.conf"),
                nodes=[f"node{i}" for i in range(1, nodes + 1)],
                cluster=cluster,
                port=base,
                up_args=list(up_args),
                release=lab_release(),
            )
            proc = lab.up(check=False, timeout=timeout)
            if proc.returncode == 0:
                lab._read_release()
                return lab
            last = f"up.sh exited {proc.returncode}\n{proc.stdout}{proc.stderr}\n{lab.log_tail()}"
            port_clash = "Address already in use" in lab.log_tail(lines=200)
            lab.down(purge=True, check=False)
            if not port_clash:
                break
        raise LabError(f"cannot start the Slurm lab in {home}:\n{last}")

    def _read_release(self) -> None:
        """Take the release and root that up.sh recorded in DIR/lab.release."""
        info = dict(
            line.split("=", 1)
            for line in (self.dir / "lab.release").read_text().splitlines()
            if "=" in line
        )
        self.release = info.get("release", self.release)
        self.root = Path(info["root"]) if info.get("root") else None
        self.env = lab_env(self.conf, bin_dir=self.bin_dir)

    @property
    def bin_dir(self) -> Path | None:
        """The lab's Slurm clients for a lab in a Debian root (None: the host's own)."""
        return self.dir / "bin" if self.root else None

    def slurm_toml(self) -> str:
        """The ``[slurm]`` keys (no header) that point guardctl at this lab."""
        text = f'conf = "{self.conf}"\n'
        if self.bin_dir:
            text += f'bin_dir = "{self.bin_dir}"\n'
        return text

    def up_command(self) -> list[str]:
        return [
            "bash",
            str(UP_SH),
            "--dir",
            str(self.dir),
            "--port",
            str(self.port),
            "--nodes",
            str(len(self.nodes)),
            "--cluster",
            self.cluster,
            "--release",
            self.release or lab_release(),
            *self.up_args,
        ]

    def up(self, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """(Re)run up.sh: starts whatever daemon of this lab is not running."""
        proc = subprocess.run(
            self.up_command(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=lab_env(self.conf),
        )
        if check and proc.returncode != 0:
            raise LabError(f"up.sh failed ({proc.returncode}):\n{proc.stderr}\n{self.log_tail()}")
        return proc

    def down(self, purge: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run down.sh for this lab (with --purge: also delete its files)."""
        argv = ["bash", str(DOWN_SH), "--dir", str(self.dir)] + (["--purge"] if purge else [])
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
        )
        if check and proc.returncode != 0:
            raise LabError(f"down.sh failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of each daemon log of this lab, for error messages."""
        out = []
        for log in sorted((self.dir / "log").glob("*.log")):
            try:
                text = log.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            out.append(f"--- {log}\n" + "\n".join(text))
        return "\n".join(out)

    # ------------------------------------------------------------ commands
    def sh(
        self,
        *argv: str,
        check: bool = True,
        timeout: float = 30,
        input: str | None = None,
        cwd: Path | str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (e.g. ``lab.sh("scontrol", "ping")``) with the lab's env.

        Text mode, output captured, cwd defaults to the lab dir (so sbatch's
        slurm-%j.out files never land in the repo).  With check=True a
        non-zero exit raises LabCommandError (a subprocess.CalledProcessError
        whose message includes stdout and stderr).
        """
        proc = subprocess.run(
            [str(a) for a in argv],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=str(cwd or self.dir),
        )
        if check and proc.returncode != 0:
            raise LabCommandError(
                proc.returncode, proc.args, output=proc.stdout, stderr=proc.stderr
            )
        return proc

    def sinfo_json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.sh("sinfo", "--json").stdout)
        return data

    def squeue_json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.sh("squeue", "--json").stdout)
        return data

    def node_state(self, name: str) -> dict[str, Any]:
        """The node's dict in 22.05's ``sinfo --json`` shape (keys: name, state,
        state_flags, reason, cpus, ...).  22.05's --json ignores filters, so this
        picks it out.  From 23.02 the node comes from ``scontrol --json show
        nodes``, whose ``state`` list is split here into 22.05's lower-case base
        state and upper-case ``state_flags``."""
        if self.release == "22.05":
            nodes = self.sinfo_json().get("nodes", [])
        else:
            nodes = json.loads(self.sh("scontrol", "--json", "show", "nodes").stdout)["nodes"]
        for node in nodes:
            if node.get("name") == name:
                out = dict(node)
                if isinstance(out.get("state"), list):
                    words = [str(w) for w in out["state"]]
                    out["state"] = words[0].lower() if words else "unknown"
                    out["state_flags"] = words[1:]
                return out
        raise KeyError(f"node {name!r} not in the node list of lab {self.cluster}")

    def states(self) -> dict[str, str]:
        """{node: long state} from ``sinfo -N -o '%N %T'``, e.g. "idle",
        "drained", "idle*" (the * meaning: not responding)."""
        out = self.sh("sinfo", "-h", "-N", "-o", "%N %T").stdout
        result: dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                result[parts[0]] = parts[1]
        return result

    def wait_states(
        self, want: dict[str, str | Iterable[str]], timeout: float = 30, interval: float = 0.2
    ) -> dict[str, str]:
        """Poll until every node in *want* is in (one of) the given long states."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while True:
            try:
                states = self.states()
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                states = {}
            ok = True
            for node, wanted in want.items():
                allowed = {wanted} if isinstance(wanted, str) else set(wanted)
                if states.get(node) not in allowed:
                    ok = False
                    break
            if ok:
                return states
            if time.monotonic() >= deadline:
                raise TimeoutError(f"lab {self.cluster}: wanted {want}, have {states}")
            time.sleep(interval)

    def wait_idle(self, nodes: Iterable[str] | None = None, timeout: float = 30) -> None:
        """Poll until the given nodes (default: all) are plainly ``idle``."""
        self.wait_states({n: "idle" for n in (nodes or self.nodes)}, timeout=timeout)

    # ------------------------------------------------------------ jobs
    def submit(
        self,
        script: str,
        *sbatch_args: str,
        timeout: float = 30,
        cwd: Path | str | None = None,
        as_user: Path | None = None,
    ) -> str:
        """Write *script* (a complete batch script, '#!' line included) to a
        file in the lab dir, sbatch it (``--parsable`` plus *sbatch_args*)
        and return the job id.  sbatch runs in *cwd* (default: the lab dir),
        which becomes the job's SLURM_SUBMIT_DIR and working directory.

        With *as_user* (a :meth:`user_workdir`) the job is :data:`JOB_USER`'s: the script is
        written there and sbatch runs there, as that user."""
        self._job_seq += 1
        jobs = as_user or self.dir / "jobs"
        jobs.mkdir(exist_ok=True)
        path = jobs / f"job-{os.getpid()}-{self._job_seq}.sh"
        path.write_text(script)
        path.chmod(0o755)
        argv = ("sbatch", "--parsable", *sbatch_args, str(path))
        if as_user is not None:
            argv = self.as_job_user(*argv, cwd=as_user)
            cwd = as_user
        out: str = self.sh(*argv, timeout=timeout, cwd=cwd).stdout
        return out.strip().split(";")[0]

    def user_workdir(self) -> Path:
        """A fresh directory of :data:`JOB_USER`'s (mode 0755, under the lab dir) for one
        test's user jobs: their scripts, output and working directory; a store may go beside."""
        top = self.dir / "users"
        top.mkdir(mode=0o755, exist_ok=True)
        self.dir.chmod(0o755)
        work = Path(tempfile.mkdtemp(prefix="work-", dir=top))
        uid, gid = job_user_ids()
        os.chown(work, uid, gid)
        work.chmod(0o755)
        if self.root is None:
            let_job_user_run(sys.executable)
        return work

    def as_job_user(self, *argv: str, cwd: Path) -> tuple[str, ...]:
        """*argv* run as :data:`JOB_USER` in *cwd*: through runuser on the host's Slurm; in a
        release's root with chroot's --userspec (the root's client wrappers chroot, which
        only root may do)."""
        if self.root is None:
            return ("runuser", "-u", JOB_USER, "--", *argv)
        uid, gid = job_user_ids()
        return (
            "chroot",
            f"--userspec={uid}:{gid}",
            f"--groups={gid}",
            str(self.root),
            "/usr/bin/env",
            f"--chdir={cwd}",
            *argv,
        )

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict (JobState, NodeList, ExitCode...)."""
        out = self.sh("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_job(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        """Poll until the job is in a terminal state; returns its job_info()."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job_info(job_id)
            if info.get("JobState") in TERMINAL_JOB_STATES:
                return info
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} not finished after {timeout}s: {info}")
            time.sleep(0.2)

    # ------------------------------------------------------------ daemons
    @property
    def ctld_pidfile(self) -> Path:
        return self.dir / "run" / "slurmctld.pid"

    def slurmd_pidfile(self, node: str) -> Path:
        return self.dir / "run" / f"slurmd-{node}.pid"

    def controller_pid(self) -> int | None:
        return _pid_alive(self.ctld_pidfile, "slurmctld")

    def slurmd_pid(self, node: str) -> int | None:
        return _pid_alive(self.slurmd_pidfile(node), "slurmd")

    def controller_running(self) -> bool:
        return self.controller_pid() is not None

    def stop_controller(self, timeout: float = 20) -> None:
        """Stop only this lab's slurmctld (SIGTERM by pid, then SIGKILL).
        The slurmd and running jobs keep running: "Slurm is down"."""
        pid = self.controller_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not _wait_pid_gone(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_pid_gone(pid, 5)

    def start_controller(self, timeout: float = 30) -> None:
        """Start this lab's slurmctld again (state kept) and wait until it answers."""
        if self.controller_pid() is None:
            log = self.dir / "log" / "slurmctld.out"
            with open(log, "ab") as out:
                chroot = ["chroot", str(self.root)] if self.root else []
                subprocess.run(
                    [*chroot, "slurmctld", "-f", str(self.conf)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    check=True,
                    timeout=timeout,
                )
        deadline = time.monotonic() + timeout
        while True:
            proc = self.sh("scontrol", "ping", check=False, timeout=timeout)
            if proc.returncode == 0 and "UP" in proc.stdout:
                return
            if time.monotonic() >= deadline:
                raise LabError(f"slurmctld of {self.cluster} does not answer:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop_slurmd(self, node: str, timeout: float = 20) -> None:
        """Stop one node's slurmd by pid (its jobs' processes keep running)."""
        pid = self.slurmd_pid(node)
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not _wait_pid_gone(pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_pid_gone(pid, 5)

    def ensure_daemons(self) -> None:
        """Restart (via up.sh) any daemon of this lab that is not running."""
        if self.controller_running() and all(self.slurmd_pid(n) for n in self.nodes):
            return
        self.up()

    # ------------------------------------------------------------ reset
    def cancel_all_jobs(self, timeout: float = 60) -> None:
        ids = self.sh("squeue", "-h", "-o", "%i").stdout.split()
        if ids:
            self.sh("scancel", *ids, check=False)
        deadline = time.monotonic() + timeout
        while self.sh("squeue", "-h", "-o", "%i").stdout.split():
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"jobs still in the queue of {self.cluster}:\n"
                    + self.sh("squeue", check=False).stdout
                )
            time.sleep(0.2)

    def delete_reservations(self) -> None:
        out = self.sh("scontrol", "show", "reservation", "-o", check=False).stdout
        for name in re.findall(r"^ReservationName=(\S+)", out, flags=re.M):
            self.sh("scontrol", "delete", f"ReservationName={name}", check=False)

    def resume_all(self) -> None:
        """RESUME every node that is not plainly idle/busy (drained, down...)."""
        busy = {"idle", "allocated", "mixed", "completing", "planned"}
        for node, state in self.states().items():
            if state not in busy:
                self.sh("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)

    def reset(self, timeout: float = 90) -> None:
        """Back to a clean cluster: all daemons up, no jobs, no reservations,
        every node resumed, and all nodes idle."""
        self.ensure_daemons()
        self.start_controller()
        self.cancel_all_jobs(timeout=timeout)
        self.delete_reservations()
        deadline = time.monotonic() + timeout
        while True:
            self.resume_all()
            try:
                self.wait_idle(timeout=min(10, max(1, deadline - time.monotonic())))
                return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
