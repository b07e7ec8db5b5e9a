"""Helpers for the data-sharding tests: a real service process on loopback, in a temp store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from guardctl.config import load_settings
from guardctl.dds.dataset import JobSpec, index_range
from guardctl.dds.http_server import Server
from guardctl.dds.service import GroupCommit, Service, open_ledger

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "dds_train.py"
SECRET = "s3cret"  # of the services run in the test's own process


class ServiceProcess:
    """``guardctl dds serve`` for one job, run as a child process that tests may kill."""

    def __init__(
        self,
        store: Path,
        job: str,
        args: Sequence[str],
        lease_s: float,
        settings: Sequence[str] = ("dds.bind=127.0.0.1",),
        python: Sequence[str] = (sys.executable,),
    ) -> None:
        self.store = store
        self.job = job
        self.args = list(args)
        self.lease_s = lease_s
        self.settings = list(settings)  # --set assignments (loopback unless a test says)
        self.python = list(python)  # what runs ``-m guardctl``
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
        argv = [*self.python, "-m", "guardctl", "--set", f"dds.lease_s={self.lease_s}"]
        for setting in self.settings:
            argv += ["--set", setting]
        argv += ["dds", "serve", "--job", self.job]
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


class RawConn:
    """A raw keep-alive HTTP/1.1 connection: no client library to make cycles of its own."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, path: str, body: dict[str, object], secret: str = SECRET) -> dict:
        return await self.request("POST", path, json.dumps(body).encode(), secret)

    async def request(self, method: str, path: str, raw: bytes = b"", secret: str = SECRET) -> dict:
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(raw)}\r\n"
            f"Authorization: Bearer {secret}\r\n\r\n".encode()
            + raw
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        reply: dict = json.loads(await self.reader.readexactly(length))
        reply["http_status"] = int(head[9:12])
        return reply


@contextlib.asynccontextmanager
async def serving(store: Path) -> AsyncIterator[int]:
    """Serve one job in this process (commits in the loop); yield its port."""
    settings = load_settings(assignments=(f"store.root={store}",), environ={})
    spec = JobSpec(index_range(100_000), 10, 2, 7, True, 0)
    ledger, _ = open_ledger(settings, "cycles", spec)
    service = Service(ledger, GroupCommit(ledger.db, 0.0), SECRET.encode(), "cycles")
    server = Server(service.handler(), service.authorization)
    try:
        yield await server.start("127.0.0.1", 0)
    finally:
        await server.close()
        ledger.db.flush()
        ledger.db.close()
