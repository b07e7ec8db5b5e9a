"""The data-sharding client for training scripts: ``from guardctl.dds import Client``.

Synchronous (training loops are), on the standard library's ``http.client``
with one keep-alive connection per thread of use. Every call retries with
exponential backoff while the service is unreachable (restarting after a crash,
or not started yet), re-reading the published address each time; requests are
idempotent, so a retry never takes a second shard or counts a shard twice.
A rank kept waiting (no service published yet, or one that does not answer)
says on stderr what it waits for, once after ``notice_s`` (5 s), then every
six times as long, so that a silent pause is never mistaken for a hang.

Pull mode::

    client = Client()                      # job, address and secret from the job's environment
    for shard in client.shards():          # leased, renewed in the background, acknowledged
        train_on(shard.start, shard.end)   # global record indices [start, end)

Per-step mode (synchronous data parallel)::

    batch = client.next_batch(step, compute_s=probe.last().compute_s)
    loss = loss_fn(model(inputs_of(batch.ranges)), reduction="sum") * batch.scale(world)

``batch.scale(world)`` (``world / global batch``) makes DDP's average of the
ranks' gradients the global batch's mean gradient, also for a rank whose share
is zero (a ``mean`` loss times ``weight`` would be NaN there, and DDP divides
by the world size). Job, rank and world come from :mod:`guardctl.identity`
(torchrun's variables, then Slurm's). ``guardctl.torch`` wraps all of this for
DataLoader.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guardctl import identity
from guardctl.config import Settings, load_settings
from guardctl.dds import paths as dds_paths
from guardctl.errors import ExitCode, GuardctlError, RefusedError, UsageError

ENV_JOB = "GUARDCTL_DDS_JOB"
ENV_ADDRESS = "GUARDCTL_DDS_ADDRESS"
ENV_SECRET = "GUARDCTL_DDS_SECRET"


NOTICE_S = 5.0  # a rank says what it waits for after this long, then every six times as long


class ServiceUnavailable(GuardctlError):
    """The job's service did not answer within the retry time."""

    exit_code = ExitCode.IO


class NotAuthorised(RefusedError):
    """The service refused this client's secret."""


class RequestRejected(UsageError):
    """The service rejected the request as malformed or contradicting the job's state."""


@dataclass
class Shard:
    """One leased shard: global record indices ``[start, end)`` of *epoch*."""

    lease: int
    epoch: int
    shard: int
    start: int
    end: int
    pieces: list[tuple[str, int, int]]  # (file, first record, end record) inside each file
    counted: bool | None = None  # after acknowledgement: did this completion count?
    lost: bool = False  # the lease was lost while processing (another worker may redo it)

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Batch:
    """This rank's part of one global step."""

    step: int
    epoch: int
    share: int  # samples this rank processes
    weight: float  # share / global batch: scale this rank's gradient by it
    batch: int  # the step's global batch
    ranges: list[tuple[int, int]] = field(default_factory=list)  # global indices [start, end)

    def scale(self, world: int) -> float:
        """Factor for a *sum*-reduced loss so that DDP's gradient average over *world*
        ranks is the mean over the global batch (0 for an empty global batch)."""
        return world / self.batch if self.batch else 0.0

    def indices(self) -> Iterator[int]:
        for start, end in self.ranges:
            yield from range(start, end)


class _Waiting:
    """One wait of a rank, told on stderr: first after *first_s*, then every 6 x *first_s*."""

    def __init__(self, first_s: float) -> None:
        self.start = time.monotonic()
        self.due = self.start + first_s
        self.every = 6 * first_s

    def tell(self, what: str) -> None:
        now = time.monotonic()
        if now >= self.due:
            waited = now - self.start
            print(f"guardctl: {what} (waiting for {waited:.0f} s)", file=sys.stderr, flush=True)
            self.due = now + self.every


class _Channel:
    """One keep-alive HTTP connection, used by one thread at a time."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None
        self.target: tuple[str, int] | None = None
        self.lock = threading.Lock()

    def send(
        self, target: tuple[str, int], method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        if self.conn is None or self.target != target:
            self.close()
            self.conn = http.client.HTTPConnection(target[0], target[1], timeout=self.timeout)
            self.target = target
        self.conn.request(method, path, body=body, headers=headers)
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Client:
    """A training rank's handle on its job's data-sharding service."""

    def __init__(
        self,
        job: str | None = None,
        *,
        worker: str | None = None,
        rank: int | None = None,
        world: int | None = None,
        address: str | None = None,
        secret: str | None = None,
        settings: Settings | None = None,
        retry_s: float | None = None,
        timeout_s: float = 10.0,
        prefetch: bool = True,
        notice_s: float = NOTICE_S,
    ) -> None:
        env = os.environ
        self.settings = settings if settings is not None else load_settings()
        who = identity.from_env()
        self.job = job or env.get(ENV_JOB) or who.job or ""
        self.worker = worker or who.worker
        self.rank = rank if rank is not None else who.rank
        self.world = world if world is not None else who.world
        self.retry_s = retry_s if retry_s is not None else self.settings.dds.client_retry_s
        self._fixed_address = address or env.get(ENV_ADDRESS)
        self._secret = secret or env.get(ENV_SECRET)
        self._paths = dds_paths.job_paths(self.settings, self.job) if self.job else None
        if self._paths is None and not (self._fixed_address and self._secret):
            raise UsageError(
                "no job id: pass job=..., or set GUARDCTL_JOB or SLURM_JOB_ID, "
                "or give address and secret"
            )
        self._target: tuple[str, int] | None = None
        self._main = _Channel(timeout_s)
        self._renewals = _Channel(timeout_s)
        self._ahead_channel = _Channel(timeout_s)
        self.prefetch = prefetch
        self.notice_s = notice_s
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple[int, Future[dict[str, Any]]] | None = None
        self._last_share = 0
        self._last_batch_at: float | None = None
        self.retries = 0

    # -- finding the service ------------------------------------------------------------------

    def _discover(self, deadline: float, waiting: _Waiting) -> tuple[str, int]:
        """The service's address and secret, waiting for the service to publish them."""
        while True:
            if self._fixed_address:
                host, _, port = self._fixed_address.rpartition(":")
                if not host or not port.isdigit():
                    raise UsageError(f"bad service address {self._fixed_address!r}: want HOST:PORT")
                found: tuple[str, int] | None = (host, int(port))
            else:
                assert self._paths is not None
                found = dds_paths.read_address(self._paths.address)
            if found is not None and self._secret is None and self._paths is not None:
                with contextlib.suppress(GuardctlError):
                    self._secret = dds_paths.read_secret(self._paths.secret)
            if found is not None and self._secret is not None:
                return found
            where = self._paths.dir if self._paths is not None else "the environment"
            if time.monotonic() > deadline:
                raise ServiceUnavailable(
                    f"no data-sharding service published for job {self.job} in {where} "
                    f"within {self.settings.dds.discover_timeout_s:.0f} s "
                    f"(dds.discover_timeout_s): is `guardctl dds serve` running for this job?"
                )
            waiting.tell(
                f"job {self.job} has no data-sharding service yet: waiting for "
                f"`guardctl dds serve --job {self.job}` to publish its address in {where}, "
                f"up to {self.settings.dds.discover_timeout_s:.0f} s"
            )
            time.sleep(0.2)

    def _call(
        self, path: str, body: dict[str, Any] | None = None, channel: _Channel | None = None
    ) -> dict[str, Any]:
        """One request, retried with backoff until it gets an answer or retry_s has passed."""
        channel = channel or self._main
        data = b"" if body is None else json.dumps(body).encode()
        method = "GET" if body is None else "POST"
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        waiting = _Waiting(self.notice_s)
        with channel.lock:
            while True:
                if self._target is None:
                    self._target = self._discover(
                        time.monotonic() + self.settings.dds.discover_timeout_s, waiting
                    )
                headers = {
                    "Authorization": f"Bearer {self._secret}",
                    "Content-Type": "application/json",
                }
                try:
                    status, payload = channel.send(self._target, method, path, data, headers)
                except (OSError, http.client.HTTPException) as exc:
                    channel.close()
                    failure: str = str(exc) or type(exc).__name__
                else:
                    if status != 503:
                        return self._answer(status, payload, path)
                    failure = "service unavailable (503)"
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(
                        f"the data-sharding service of job {self.job} did not answer "
                        f"for {self.retry_s:.0f} s: {failure}"
                    )
                self.retries += 1
                host, port = self._target
                waiting.tell(
                    f"the data-sharding service of job {self.job} at {host}:{port} does not "
                    f"answer ({failure}): retrying up to {self.retry_s:.0f} s"
                )
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 2.0)
                # The service may have restarted elsewhere: read its address again.
                self._target = None if not self._fixed_address else self._target

    def _answer(self, status: int, payload: bytes, path: str) -> dict[str, Any]:
        try:
            reply = json.loads(payload) if payload else {}
        except ValueError:
            reply = {"error": payload[:200].decode(errors="replace")}
        if status == 401:
            raise NotAuthorised(f"the data-sharding service of job {self.job} refused our secret")
        if status >= 400:
            raise RequestRejected(f"{path}: {reply.get('error', f'HTTP {status}')}")
        return dict(reply)

    # -- pull mode ----------------------------------------------------------------------------

    def lease(self) -> Shard | None:
        """Lease the next shard; wait while others hold the last ones; None when all are done."""
        return self._leased(uuid.uuid4().hex, None)

    def _leased(self, request_id: str, reply: dict[str, Any] | None) -> Shard | None:
        """The shard of lease request *request_id*, asking (again) until it is not "wait"."""
        while True:
            if reply is None:
                reply = self._call("/v1/lease", {"worker": self.worker, "request_id": request_id})
            if reply["status"] == "end":
                return None
            if reply["status"] == "wait":
                time.sleep(float(reply.get("retry_s", 0.5)))
                reply = None
                continue
            return Shard(
                lease=int(reply["lease"]),
                epoch=int(reply["epoch"]),
                shard=int(reply["shard"]),
                start=int(reply["start"]),
                end=int(reply["end"]),
                pieces=[(str(f), int(a), int(b)) for f, a, b in reply.get("pieces", [])],
            )

    def renew(self, shard: Shard) -> bool:
        """Extend the lease; False if it was lost (another worker may be doing the shard)."""
        reply = self._call("/v1/renew", {"lease": shard.lease}, channel=self._renewals)
        if reply["status"] != "ok":
            shard.lost = True
        return not shard.lost

    def ack(self, shard: Shard) -> bool:
        """Report the shard processed; True if this completion counts, False if it is
        ``already_done`` or ``revoked`` (then discard what was learnt from it)."""
        reply = self._call("/v1/ack", {"lease": shard.lease})
        shard.counted = bool(reply.get("counted"))
        return shard.counted

    def ack_and_lease(self, shard: Shard) -> tuple[bool, Shard | None]:
        """Acknowledge *shard* and lease the next one in the same round trip.

        Returns whether the completion counted (see :meth:`ack`) and the next
        shard (None when all are done).
        """
        request_id = uuid.uuid4().hex
        reply = self._call(
            "/v1/ack",
            {"lease": shard.lease, "next": {"worker": self.worker, "request_id": request_id}},
        )
        shard.counted = bool(reply.get("counted"))
        return shard.counted, self._leased(request_id, reply["next"])

    @contextlib.contextmanager
    def renewing(self, shard: Shard, lease_s: float | None = None) -> Iterator[Shard]:
        """Keep *shard*'s lease alive in a background thread while the block runs."""
        period = (lease_s or self.settings.dds.lease_s) / 3
        stop = threading.Event()

        def renew_loop() -> None:
            while not stop.wait(period):
                try:
                    if not self.renew(shard):
                        return
                except GuardctlError:
                    return

        thread = threading.Thread(target=renew_loop, name=f"dds-renew-{shard.lease}", daemon=True)
        thread.start()
        try:
            yield shard
        finally:
            stop.set()
            thread.join()

    def shards(self) -> Iterator[Shard]:
        """Lease, renew and acknowledge shards until the job's last epoch is done.

        A shard is acknowledged when the loop body asks for the next one; its
        ``counted`` attribute then says whether the completion counted.
        """
        shard = self.lease()
        while shard is not None:
            with self.renewing(shard):
                yield shard
            _, shard = self.ack_and_lease(shard)

    # -- per-step mode ------------------------------------------------------------------------

    def next_batch(self, step: int, compute_s: float | None = None) -> Batch | None:
        """This rank's part of global *step*; None after the last epoch.

        *compute_s* is how long this rank computed its previous part (without
        waiting for the others, e.g. the probe's ``compute_s``); without it the
        time since the previous call is used, which includes that wait.

        With ``prefetch`` (the default) the part of step+1 is asked for in the
        background while this step computes, so the request costs the step no
        time; its split then rests on speeds one step older.
        """
        now = time.monotonic()
        seconds = compute_s
        if seconds is None and self._last_batch_at is not None:
            seconds = now - self._last_batch_at
        report = (self._last_share, float(seconds or 0.0))
        reply = self._prefetched(step)
        if reply is None:
            reply = self._step_call(step, report, self._main)
            report = (0, 0.0)  # sent: the prefetch must not report it twice
        self._last_batch_at = time.monotonic()
        if reply["status"] == "end":
            return None
        self._last_share = int(reply["share"])
        if self.prefetch:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="dds-prefetch")
            self._ahead = (step + 1, self._pool.submit(self._step_call, step + 1, report))
        return Batch(
            step=int(reply["step"]),
            epoch=int(reply["epoch"]),
            share=int(reply["share"]),
            weight=float(reply["weight"]),
            batch=int(reply["batch"]),
            ranges=[(int(a), int(b)) for a, b in reply["ranges"]],
        )

    def _step_call(
        self, step: int, report: tuple[int, float], channel: _Channel | None = None
    ) -> dict[str, Any]:
        body = {
            "worker": self.worker,
            "rank": self.rank,
            "world": self.world,
            "step": step,
            "samples": report[0],
            "seconds": report[1],
        }
        return self._call("/v1/step", body, channel=channel or self._ahead_channel)

    def _prefetched(self, step: int) -> dict[str, Any] | None:
        """The reply fetched ahead for *step*, if there is one and it succeeded."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        try:
            reply = ahead[1].result()
        except GuardctlError:
            return None  # ask again in the foreground, where the error surfaces
        return reply if ahead[0] == step else None

    # -- checkpoints ---------------------------------------------------------------------------

    def commit(self, checkpoint: str, step: int | None = None) -> dict[str, Any]:
        """Tie the completions so far to *checkpoint* (call when the checkpoint is saved)."""
        return self._call("/v1/commit", {"checkpoint": checkpoint, "step": step})

    def restore(self, checkpoint: str) -> dict[str, Any]:
        """After loading *checkpoint*: put every shard completed since back in the queue."""
        self._last_share = 0
        self._last_batch_at = None
        self._prefetched(-1)  # drop a step fetched ahead: the restore may change it
        return self._call("/v1/restore", {"checkpoint": checkpoint, "request_id": uuid.uuid4().hex})

    def status(self) -> dict[str, Any]:
        return self._call("/v1/status")

    def close(self) -> None:
        self._prefetched(-1)
        if self._pool is not None:
            self._pool.shutdown()
        self._main.close()
        self._renewals.close()
        self._ahead_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def secret_path(settings: Settings, job: str) -> Path:
    """Where the job's secret lives (for recipes that export it)."""
    return dds_paths.job_paths(settings, job).secret
