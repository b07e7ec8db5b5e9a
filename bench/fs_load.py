"""The shared filesystem's load from one node (8 ranks and its agent): per-rank files or the agent.

One node's writers, for real: the node agent (``guardctl agent``, host collector, every setting
at its default) and 8 training ranks (``probe.step()`` around a 50 ms step), each a process of
its own run under ``strace -f -y -ttt``, in two layouts one after the other:

- ``per-rank``: the layout without hand-off: every rank appends (and fsyncs) its own step file
  and its column mirror every second, the agent its node file every sample;
- ``agent``: the ranks hand their steps to the agent over its socket (node-local), and the agent
  appends one node file, holding every kind, every ``write_interval_s``.

Counted in the steady part of each run (after the first 5 s, to the last step), on files under
the store only: appends (``write``/``pwrite64``/``writev`` calls), fsyncs (``fsync`` /
``fdatasync``), opens (``openat``), other metadata calls (``stat`` family, ``mkdir``) and the
files created (the store's file count after the run, less before); open files: the store's
descriptors held by the node's processes, read from ``/proc/<pid>/fd`` twice a second (the most
at once). What the page cache hides: the wall time the writers spent inside those appends and
fsyncs (``strace -T``), in milliseconds per second of the run, all processes together, and the
longest fsync; strace's own overhead is in each call's time alike, so compare these between
filesystems, not with an untraced run.

``--dir DIR`` puts the stores on DIR, any mounted filesystem (a site's NFS, or
``tools/netfs.sh``'s sshfs over loopback), named by its type in the output (from
``/proc/mounts``); the default is ``/var/tmp``. The node-local files (the agent's socket and
status file, strace's logs) stay in the local temp directory. ``--nfs`` runs the same on an NFS
export of a local directory mounted over loopback (``nfs-kernel-server``), or says in one line
why it cannot here.

    python bench/fs_load.py [--seconds 65] [--dir DIR] [--nfs] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RANKS = 8
STEP_S = 0.05
WARMUP_S = 5.0
TRACED = (
    "openat,open,creat,write,pwrite64,writev,fsync,fdatasync,newfstatat,statx,stat,lstat,"
    "fstat,mkdir,mkdirat,ftruncate"
)
RANK = """
import sys, time
from guardctl import probe
rank, socket, seconds, step = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
probe.configure(job="4242", rank=rank, node="bench01", agent_socket=socket)
end = time.monotonic() + seconds - 1.0
while time.monotonic() < end:
    with probe.step():
        time.sleep(step * 0.8)
        probe.comm_begin()
        time.sleep(step * 0.2)
# What a step costs the training loop, the flush thread handing over meanwhile: empty steps.
n = int(sys.argv[6])
start = time.perf_counter()
for _ in range(n):
    with probe.step():
        probe.comm_begin()
cost = (time.perf_counter() - start) / max(1, n) * 1e6
probe.flush()
open(sys.argv[5], "w").write(repr(cost))
"""
_CALL = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(\w+)\((.*)$")
# A call another thread's interrupted, finished on a line of its own: its time is there.
_RESUMED = re.compile(r"^(\d+)\s+\d+\.\d+\s+<\.\.\. (\w+) resumed>")
_DURATION = re.compile(r"<(\d+\.\d+)>$")
APPENDS = ("write", "pwrite64", "writev")
FSYNCS = ("fsync", "fdatasync")


def _env(store: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARDCTL_")}
    env["GUARDCTL_STORE"] = str(store)
    env["PYTHONPATH"] = str(REPO)
    return env


def _traced(log: Path, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    strace = ["strace", "-f", "-y", "-qq", "-ttt", "-T", "-e", f"trace={TRACED}", "-o", str(log)]
    return subprocess.Popen(
        [*strace, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _tree(pid: int) -> list[int]:
    """*pid* and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return out


def _open_files(pids: list[int], store: str) -> int:
    count = 0
    for pid in {p for top in pids for p in _tree(top)}:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(store + "/"):
                    count += 1
            except OSError:
                pass
    return count


def _files(store: Path) -> int:
    return sum(1 for p in store.rglob("*") if p.is_file())


def step_cost(layout: str, top: Path, steps: int = 300_000) -> float:
    """Microseconds an empty step costs one rank's loop (nothing traced), its flush thread
    writing the store or handing over to a running agent meanwhile: the worst case."""
    from guardctl.storage import store as shared_store

    store = top / f"cost-{layout}"
    local = Path(tempfile.mkdtemp(prefix="fs-load-"))
    local.chmod(0o755)
    shared_store.init(store)
    socket = str(local / "agent.sock") if layout == "agent" else ""
    env = _env(store)
    agent = None
    if socket:
        argv = [sys.executable, "-m", "guardctl", "--set", 'agent.collectors=["host"]']
        argv += ["--set", 'agent.status_file=""', "--set", f'agent.handoff_socket="{socket}"']
        agent = subprocess.Popen(
            [*argv, "agent", "--node", "bench01"], env=env, stderr=subprocess.DEVNULL
        )
        while not os.path.exists(socket):
            time.sleep(0.1)
    cost = local / "cost"
    argv = [sys.executable, "-c", RANK, "0", socket, "1", "0.001", str(cost), str(steps)]
    subprocess.run(argv, env=env, check=True, timeout=600, stderr=subprocess.DEVNULL)
    if agent is not None:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
    value = float(cost.read_text())
    shutil.rmtree(local, ignore_errors=True)
    return round(value, 2)


def run_layout(layout: str, top: Path, seconds: float) -> dict[str, Any]:
    from guardctl.storage import store as shared_store

    store = top / f"store-{layout}"
    local = Path(tempfile.mkdtemp(prefix="fs-load-"))  # node-local: status file, socket, logs
    local.chmod(0o755)
    shared_store.init(store)
    before = _files(store)
    socket = str(local / "agent.sock") if layout == "agent" else ""
    settings = [
        "--set",
        'agent.collectors=["host"]',
        "--set",
        f'agent.status_file="{local / "status.json"}"',
        "--set",
        f'agent.handoff_socket="{socket}"',
    ]
    if layout == "per-rank":
        settings += ["--set", "agent.write_interval_s=0"]  # each sample, as without hand-off
    env = _env(store)
    agent_argv = [sys.executable, "-m", "guardctl", *settings, "agent", "--node", "bench01"]
    procs = [_traced(local / "strace.agent", agent_argv, env)]
    deadline = time.monotonic() + 30
    while socket and not os.path.exists(socket):
        if time.monotonic() > deadline:
            raise SystemExit(f"fs_load: the agent did not open {socket}")
        time.sleep(0.1)
    started = time.time()
    for rank in range(RANKS):
        cost = str(local / f"cost.{rank}")
        argv = [sys.executable, "-c", RANK, str(rank), socket, str(seconds), str(STEP_S), cost]
        argv.append("0")  # the step's own cost is measured untraced (step_cost)
        procs.append(_traced(local / f"strace.rank{rank}", argv, env))
    most_open = 0
    while time.time() < started + seconds:
        time.sleep(0.5)
        if time.time() > started + WARMUP_S:
            most_open = max(most_open, _open_files([p.pid for p in procs], str(store)))
    window = (started + WARMUP_S, started + seconds)
    for proc in procs[1:]:
        proc.wait(timeout=120)
    agent = _tree(procs[0].pid)[1:]  # strace's child: the agent (SIGTERM to strace detaches)
    for pid in agent[:1]:
        os.kill(pid, signal.SIGTERM)
    procs[0].wait(timeout=60)
    counts, times = _count(local, str(store), window)
    status = json.loads((local / "status.json").read_text())
    steps = _steps(store)
    shutil.rmtree(local, ignore_errors=True)
    span = window[1] - window[0]
    return {
        "layout": layout,
        "seconds": round(span, 1),
        "appends_per_s": round(counts["append"] / span, 3),
        "fsyncs_per_s": round(counts["fsync"] / span, 3),
        "opens_per_s": round(counts["open"] / span, 3),
        "metadata_per_s": round(counts["meta"] / span, 3),
        "append_ms_per_s": round(times["append"] * 1e3 / span, 3),
        "fsync_ms_per_s": round(times["fsync"] * 1e3 / span, 3),
        "fsync_ms_max": round(times["fsync_max"] * 1e3, 3),
        "files_created": _files(store) - before,
        "open_files_most": most_open,
        "step_records": steps,
        "handoff": status.get("handoff", {}),
    }


def _steps(store: Path) -> int:
    from guardctl.telemetry.schema import read_path

    return sum(1 for r in read_path(store).records if r["kind"] == "step")


def _count(
    local: Path, store: str, window: tuple[float, float]
) -> tuple[Counter[str], dict[str, float]]:
    """The calls on the store's files in *window*, by sort, from strace's logs in *local*;
    and the seconds spent in its appends and fsyncs (all together, and the longest fsync)."""
    counts: Counter[str] = Counter()
    times = {"append": 0.0, "fsync": 0.0, "fsync_max": 0.0}
    for log in local.glob("strace.*"):
        pending: dict[str, str] = {}  # thread: the timed sort of its unfinished call
        for line in log.read_text(errors="replace").splitlines():
            resumed = _RESUMED.match(line)
            if resumed:
                sort = pending.pop(resumed.group(1), "")
                if sort:
                    _add_time(times, sort, line)
                continue
            match = _CALL.match(line)
            if not match or not window[0] <= float(match.group(2)) < window[1]:
                continue
            call, fields = match.group(3), match.group(4).split(", ", 2)
            # The file is the first argument (a descriptor, -y names its file), or the second
            # of the *at calls; a write's second is its data, which may name the store.
            named = fields[:1] if call in APPENDS else fields[:2]
            if not any(store + "/" in f or f.endswith(store + ">") for f in named):
                continue
            sort = _sort(call)
            if sort:
                counts[sort] += 1
            if sort in ("append", "fsync"):
                if line.endswith("<unfinished ...>"):
                    pending[match.group(1)] = sort
                else:
                    _add_time(times, sort, line)
    return counts, times


def _sort(call: str) -> str:
    if call in APPENDS:
        return "append"
    if call in FSYNCS:
        return "fsync"
    if call in ("openat", "open", "creat"):
        return "open"
    return "" if call == "ftruncate" else "meta"


def _add_time(times: dict[str, float], sort: str, line: str) -> None:
    """Add the call's time (``strace -T``: ``<seconds>`` ending its line) to *sort*'s."""
    found = _DURATION.search(line)
    if found is None:
        return
    seconds = float(found.group(1))
    times[sort] += seconds
    if sort == "fsync":
        times["fsync_max"] = max(times["fsync_max"], seconds)


def filesystem_type(path: Path) -> str:
    """The type of the filesystem *path* is on (``ext4``, ``nfs4``, ``fuse.sshfs``...)."""
    from segment_format import filesystem  # beside this script: one reading of /proc/mounts

    return filesystem(path).split(" ", 1)[0]


def nfs_dir() -> tuple[Path | None, str]:
    """A directory on an NFS mount of a local export over loopback, or why there is none."""
    filesystems = Path("/proc/filesystems").read_text().split()
    missing = [fs for fs in ("nfsd", "nfs") if fs not in filesystems]
    if missing:
        return None, (
            f"NFS skipped: this kernel ({os.uname().release}) has no {' and no '.join(missing)} "
            "filesystem and no module to load (a container or microVM): nfs-kernel-server "
            "cannot serve nor the NFS client mount"
        )
    export = Path(tempfile.mkdtemp(prefix="fs-load-export-"))
    mount = Path(tempfile.mkdtemp(prefix="fs-load-nfs-"))
    steps = [
        ["exportfs", "-o", "rw,sync,no_root_squash,no_subtree_check", f"127.0.0.1:{export}"],
        ["mount", "-t", "nfs", "-o", "vers=4.2,hard", f"127.0.0.1:{export}", str(mount)],
    ]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            return None, f"NFS skipped: {' '.join(argv[:2])}: {done.stderr.strip()[:200]}"
    return mount, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=65.0, help="each run's length")
    parser.add_argument(
        "--dir",
        type=Path,
        help="directory for the stores, on any mounted filesystem (default /var/tmp)",
    )
    parser.add_argument("--nfs", action="store_true", help="also on an NFS mount over loopback")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("strace") is None:
        print("fs_load: needs strace (apt-get install strace)", file=sys.stderr)
        return 2
    if args.dir is not None and not args.dir.is_dir():
        print(f"fs_load: no directory {args.dir}", file=sys.stderr)
        return 2
    places: list[tuple[str, Path | None, str]] = []
    local = Path(tempfile.mkdtemp(prefix="fs-load-", dir=args.dir or "/var/tmp"))
    places.append((filesystem_type(local), local, ""))
    if args.nfs:
        mount, why = nfs_dir()
        places.append(("NFS over loopback", mount, why))
    results: list[dict[str, Any]] = []
    for name, where, why in places:
        if where is None:
            results.append({"filesystem": name, "skipped": why})
            continue
        for layout in ("per-rank", "agent"):
            row = {"filesystem": name, **run_layout(layout, where, args.seconds)}
            row["probe_us_per_step"] = step_cost(layout, where)
            results.append(row)
    shutil.rmtree(local, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for row in results:
        if "skipped" in row:
            print(f"{row['filesystem']}: {row['skipped']}")
            continue
        print(
            f"{row['filesystem']:18} {row['layout']:9} appends/s {row['appends_per_s']:6.2f}  "
            f"fsyncs/s {row['fsyncs_per_s']:6.2f}  opens/s {row['opens_per_s']:5.2f}  "
            f"metadata/s {row['metadata_per_s']:5.2f}  files created {row['files_created']:3}  "
            f"open files {row['open_files_most']:3}  step records {row['step_records']}  "
            f"probe us/step {row['probe_us_per_step']}  "
            f"in appends ms/s {row['append_ms_per_s']:.2f}  "
            f"in fsyncs ms/s {row['fsync_ms_per_s']:.2f} (longest {row['fsync_ms_max']:.1f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
