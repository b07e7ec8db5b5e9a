"""Helpers for the data-sharding tests: a real service process on loopback, in a temp store."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "dds_train.py"


class ServiceProcess:
    """``guardctl dds serve`` for one job, run as a child process that tests may kill."""

    def __init__(self, store: Path, job: str, args: Sequence[str], lease_s: float) -> None:
        self.store = store
        self.job = job
        self.args = list(args)
        self.lease_s = lease_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = store / "dds" / job
        self.log = store / f"service-{job}.log"
        self.starts = 0

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
        env["GUARDCTL_STORE"] = str(self.store)
        return env

    def argv(self, with_dataset: bool) -> list[str]:
        argv = [sys.executable, "-m", "guardctl", "--set", f"dds.lease_s={self.lease_s}",
                "--set", "dds.bind=127.0.0.1", "dds", "serve", "--job", self.job]  # fmt: skip
        return argv + (self.args if with_dataset else [])

    def start(self, with_dataset: bool = True) -> None:
        old = self.address()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(with_dataset), env=self.env, stdout=log, stderr=log, cwd=REPO
            )
        self.starts += 1
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = self.address()
            if now is not None and now != old:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"service exited {self.proc.returncode}: {self.log_text()}")
            time.sleep(0.05)
        raise AssertionError(f"service did not publish its address: {self.log_text()}")

    def address(self) -> tuple[str, int, int] | None:
        try:
            data = json.loads((self.dir / "address.json").read_text())
        except (OSError, ValueError):
            return None
        return data["host"], data["port"], data["pid"]

    def kill(self) -> None:
        """SIGKILL: no chance to flush or clean up."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.dir / 'state.sqlite'}?mode=ro", uri=True)

    def worker(self, *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
        """A real training-rank process (examples/dds_train.py) of this job."""
        argv = [sys.executable, str(TRAIN), "--job", self.job, *args]
        if log is not None:
            argv += ["--log", str(log)]
        return subprocess.Popen(argv, env=self.env, cwd=REPO, stderr=subprocess.PIPE)


def done_counts(service: ServiceProcess) -> dict[tuple[int, int], int]:
    """How many times the service's accounting has each (epoch, shard) completed."""
    with service.db() as conn:
        rows = conn.execute(
            "SELECT epoch, shard, COUNT(*) FROM lease WHERE state = 'done' GROUP BY epoch, shard"
        ).fetchall()
        seqs = [s for (s,) in conn.execute("SELECT done_seq FROM lease WHERE state = 'done'")]
    # Each completion has its own number: what checkpoints and restores order them by.
    assert None not in seqs and len(set(seqs)) == len(seqs), "completions share a number"
    return {(e, s): n for e, s, n in rows}
