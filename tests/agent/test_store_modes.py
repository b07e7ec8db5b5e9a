"""The store's directories and modes: an ordinary user's ranks write their step records.

The ranks run as ``nobody`` in a forked child (no new interpreter: the test's Python may live
where that user cannot reach), as a user's job does on a cluster where the store was made by root.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from guardctl import identity, probe
from guardctl.storage import store
from guardctl.telemetry.schema import read_path

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")

NOBODY = 65534


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is private to root)."""
    top = Path(tempfile.mkdtemp(prefix="guardctl-store-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run_as_nobody(root: Path, err: Path, flushes: int = 3) -> int:
    """Fork; the child becomes nobody (umask 077, as a careful user has) and steps 4 times."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (pytest had replaced it)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.umask(0o077)
            who = identity.Identity("77", 0, 1, 0, "node1")
            # No node agent (the direct path): what is said is about the store only.
            rank = probe.Probe(who, root, flush_interval_s=60, agent_socket="")
            for _ in range(4):
                with rank.step():
                    rank.comm_begin()
            code = 0 if all(rank.flush() for _ in range(flushes)) else 3
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_init_lays_out_the_directories_with_their_modes(shared: Path) -> None:
    root = shared / "store"
    old = os.umask(0o077)  # an administrator's strict umask plays no part
    try:
        store.init(root)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in root.iterdir() if p.is_dir()}
    assert modes == {
        "steps": 0o1777,
        "dds": 0o1777,
        "telemetry": 0o755,
        "segments": 0o755,
        "actions": 0o755,
        "control": 0o755,
        "clocks": 0o755,
        "sweeps": 0o755,
        "baselines": 0o755,
        "cache": 0o755,
    }
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    assert (root / store.MARKER).is_file()
    (root / "steps").chmod(0o755)  # as a store made before: run again, init repairs it
    store.init(root)
    assert stat.S_IMODE((root / "steps").stat().st_mode) == 0o1777


def test_an_ordinary_users_rank_writes_its_step_records(shared: Path) -> None:
    root = shared / "store"
    store.init(root)
    err = shared / "stderr"
    assert run_as_nobody(root, err) == 0, err.read_text()
    job_dir = root / "steps" / "77"
    assert job_dir.stat().st_uid == NOBODY
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o755  # listable whatever the user's umask
    records = read_path(job_dir).records
    assert len(records) == 4 and {r["node"] for r in records} == {"node1"}
    assert all(p.stat().st_uid == NOBODY for p in job_dir.iterdir())
    assert err.read_text() == ""


def test_a_rank_that_cannot_write_says_so_once_on_stderr(shared: Path) -> None:
    root = shared / "store"
    root.mkdir(mode=0o755)
    (root / "steps").mkdir(mode=0o755)  # root-owned 0755: what a store without init has
    err = shared / "stderr"
    assert run_as_nobody(root, err, flushes=5) == 3  # nothing written
    lines = err.read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("guardctl probe: job 77 rank 0 on node1: cannot write step records")
    assert "EACCES" in lines[0] and "mode 1777" in lines[0] and "guardctl store init" in lines[0]
    assert list((root / "steps").iterdir()) == []
