"""``guardctl dds serve``: the HTTP service that hands out one job's shards (aiohttp).

Every request carries the job's secret (``Authorization: Bearer ...``); a
bad or missing one gets 401. Bodies are JSON; a malformed request gets 400
and the service carries on. A change is answered only after the group commit
that holds it (see :mod:`guardctl.dds.store`), and requests are idempotent
(lease request ids, lease ids, checkpoint names), so a client may retry
anything after a timeout or a restart of the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import resource
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from guardctl.config import Settings
from guardctl.dds import paths as dds_paths
from guardctl.dds.collector import Collector
from guardctl.dds.dataset import JobSpec
from guardctl.dds.ledger import ConflictError, Ledger
from guardctl.dds.status import job_status
from guardctl.dds.store import CommitProcess, StateDB
from guardctl.errors import StoreError, UsageError

log = logging.getLogger("guardctl.dds")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Op = Callable[[dict[str, Any]], dict[str, Any]]
JSON = "application/json"
MAX_BODY = 64 * 1024
IN_FLIGHT = 2  # batches handed to the commit process at once
LONG_POLL_S = 1.0  # the longest a lease request is held while shards are in flight


class BadRequest(Exception):
    """The request body is not what the endpoint takes."""


class GroupCommit:
    """Answers wait here until the batch holding their changes is committed.

    With a :class:`CommitProcess` the batch is committed there while this
    loop goes on serving. Up to ``IN_FLIGHT`` batches are handed over at once
    (the process commits them in order), so it starts the next one without
    waiting for this loop to hear about the last; meanwhile the next batch
    collects. Without a commit process, the batch is committed here, in the loop.

    An answer waits on a future of its own, kept in the list of the batch its
    change is in; when the commit process reports that batch, the whole list is
    released at once. (One future per request, not one per batch: a request
    whose task is cancelled cancels the future it waits on, and that must not
    be the other answers'.)
    """

    def __init__(self, db: StateDB, interval_s: float, writer: CommitProcess | None = None) -> None:
        self.db = db
        self.interval_s = interval_s
        self.writer = writer
        self.waiters: list[asyncio.Future[None]] = []  # for writes not handed over yet
        # Per batch handed over, oldest first: the answers waiting for it.
        self.in_flight: deque[list[asyncio.Future[None]]] = deque()
        self.scheduled = False
        self.commits = 0
        self.statements = 0
        self.failure: BaseException | None = None
        self.loop = asyncio.get_running_loop()
        if writer is not None:
            self.loop.add_reader(writer.fileno(), self._committed)
            db.before_flush = self.drain

    def waiter(self) -> asyncio.Future[None] | None:
        """A future done once every change made so far is committed (None: they already are)."""
        if self.failure is not None:
            raise StoreError(f"the state database failed: {self.failure}")
        if self.db.dirty:
            waiters = self.waiters
            self._schedule()
        elif self.in_flight:
            waiters = self.in_flight[-1]  # the answer may rest on a batch being committed
        else:
            return None
        fut = self.loop.create_future()
        waiters.append(fut)
        return fut

    async def durable(self) -> None:
        """Return once every change made so far is committed."""
        fut = self.waiter()
        if fut is not None:
            await fut

    def _schedule(self) -> None:
        if self.scheduled or len(self.in_flight) >= IN_FLIGHT:
            return  # the next report of a committed batch hands over this one
        self.scheduled = True
        # Waiting a little lets concurrent requests share one transaction.
        if self.interval_s > 0:
            self.loop.call_later(self.interval_s, self.flush)
        else:
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        if self.failure is not None or len(self.in_flight) >= IN_FLIGHT:
            return
        waiters, self.waiters = self.waiters, []
        try:
            if self.writer is None:
                self.statements += self.db.flush()
                self.commits += 1
            elif self.db.dirty:
                self.writer.send(self.db.take())
                self.in_flight.append(waiters)
                return
        except Exception as exc:  # the memory state is now ahead of the disk: stop serving
            self._fail(exc, waiters)
            return
        _release(waiters)

    def _committed(self) -> None:
        """The commit process reports the oldest batch in flight (readable pipe)."""
        assert self.writer is not None
        waiters = self.in_flight.popleft() if self.in_flight else []
        try:
            self.statements += self.writer.result()
            self.commits += 1
        except StoreError as exc:
            self._fail(exc, waiters)
            return
        _release(waiters)
        if self.waiters or self.db.dirty:
            self._schedule()

    def drain(self) -> None:
        """Wait here for the batches in flight (before this process writes the database itself)."""
        while self.in_flight and self.failure is None:
            self._committed()
        if self.failure is not None:
            raise StoreError(f"the state database failed: {self.failure}")

    def _fail(self, exc: BaseException, waiters: list[asyncio.Future[None]]) -> None:
        log.error("state database commit failed: %s", exc)
        self.failure = exc
        if self.writer is not None:
            self.loop.remove_reader(self.writer.fileno())
        error = StoreError(f"the state database failed: {exc}")
        for fut in waiters + self.waiters + [f for batch in self.in_flight for f in batch]:
            if not fut.done():
                fut.set_exception(error)
        self.waiters = []
        self.in_flight.clear()

    def close(self) -> None:
        if self.writer is not None:
            if self.failure is None:
                self.loop.remove_reader(self.writer.fileno())
            self.db.before_flush = None
            self.writer.close()


def _release(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)


class TooLarge(Exception):
    """The request body is over MAX_BODY."""


def _received_body(request: web.BaseRequest) -> bytes | None:
    """The request's body if all of it is in already (the usual case), else None."""
    content = request.content
    if not content.is_eof():
        return None
    raw = content.read_nowait()
    if len(raw) > MAX_BODY:
        raise TooLarge
    return raw


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise BadRequest("the body is not JSON") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    value: Any = body.get(name, default)
    if value is ...:
        raise BadRequest(f"missing field {name!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if value is None and default is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {name!r} must be {kind.__name__}")
    if kind is str and not 0 < len(str(value)) <= 200:
        raise BadRequest(f"field {name!r} must be 1..200 characters")
    return value


class Route(NamedTuple):
    method: str
    op: Op | None  # takes the JSON body, changes the ledger, returns the reply (then made durable)
    handler: Handler | None  # or answers the request itself
    polls: bool = False  # op's "wait" reply is held as a long poll (lease requests)


@dataclass
class Service:
    """The request handlers around one ledger."""

    ledger: Ledger
    committer: GroupCommit
    secret: bytes
    job: str
    requests: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    collector: Collector = field(default_factory=Collector)

    def routes(self) -> dict[str, Route]:
        """Path -> route, every one behind the secret check."""
        return {
            "/v1/lease": Route("POST", self._lease, None, polls=True),
            "/v1/renew": Route("POST", self._renew, None),
            "/v1/ack": Route("POST", self._ack, None),
            "/v1/step": Route("POST", self._step, None),
            "/v1/commit": Route("POST", self._commit, None),
            "/v1/restore": Route("POST", self._restore, None),
            "/v1/status": Route("GET", None, self._status),
            "/v1/health": Route("GET", None, self._health),
        }

    def server(self) -> web.Server:
        """aiohttp's low-level server with one dispatch table.

        Every lease and acknowledgement goes through here, and aiohttp's
        Application (router, middlewares, the full Request) costs a measurable
        share of each; a fixed set of exact paths needs none of it. The secret
        check, the errors and the wait for the commit are here too, in one
        coroutine per request rather than a wrapper each.
        """
        routes = self.routes()
        expected = b"Bearer " + self.secret
        committer = self.committer

        async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
            route = routes.get(request.path)
            if route is None:
                return _reply({"error": f"no endpoint {request.path}"}, 404)
            if request.method != route.method:
                return _reply({"error": f"{request.path} takes {route.method}"}, 405)
            self.requests += 1
            given = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(given, expected):
                return _reply({"error": "not authorised for this job"}, 401)
            try:
                if route.op is None:
                    assert route.handler is not None
                    return await route.handler(request)
                raw = _received_body(request)
                if raw is None:  # not all in yet: wait for the rest
                    raw = await request.read()
                body = _parse(raw)
                reply = route.op(body)
                if route.polls and reply["status"] == "wait":
                    reply = await self._long_poll(body, reply)
                fut = committer.waiter()
                if fut is not None:
                    await fut
                return _reply(reply)
            except BadRequest as exc:
                return _reply({"error": str(exc)}, 400)
            except ConflictError as exc:
                return _reply({"error": str(exc)}, 409)
            except StoreError as exc:
                return _reply({"error": str(exc)}, 503)
            except (TooLarge, web.HTTPRequestEntityTooLarge):
                return _reply({"error": f"the body is over {MAX_BODY // 1024} KiB"}, 413)

        def make_request(
            message: Any, payload: Any, protocol: Any, writer: Any, task: Any
        ) -> web.BaseRequest:
            return web.BaseRequest(
                message, payload, protocol, writer, task, asyncio.get_running_loop(),
                client_max_size=MAX_BODY,
            )  # fmt: skip

        return _Server(dispatch, request_factory=make_request, access_log=None)

    def _lease(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.ledger.lease(_field(body, "worker", str), _field(body, "request_id", str))

    async def _long_poll(self, body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """No shard is free but some are in flight: hold the lease request until one is.

        Holding it until a lease expires or the job ends (at most about a
        second) saves the worker a sleep-and-retry cycle at the end of a job.
        """
        worker, request_id = body["worker"], body["request_id"]
        deadline = time.monotonic() + LONG_POLL_S
        while reply["status"] == "wait":
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, reply["retry_s"]))
            reply = self.ledger.lease(worker, request_id)
        return reply

    def notify(self) -> None:
        """Wake the held lease requests: a shard came back or the job ended."""
        self.changed.set()
        self.changed = asyncio.Event()

    def _renew(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.ledger.renew(_field(body, "lease", int))

    def _ack(self, body: dict[str, Any]) -> dict[str, Any]:
        """Acknowledge a lease; with ``next`` (a lease request), also lease the next shard.

        One round trip instead of two per shard: a retried request repeats
        both halves idempotently (same lease, same request id).
        """
        lease = _field(body, "lease", int)
        following = body.get("next")
        if following is not None:  # checked whole before anything changes
            if not isinstance(following, dict):
                raise BadRequest("field 'next' must be a lease request object")
            worker, request_id = (
                _field(following, "worker", str),
                _field(following, "request_id", str),
            )
        reply = self.ledger.ack(lease)
        if following is not None:
            reply["next"] = self.ledger.lease(worker, request_id)
        if self.ledger.finished:
            self.notify()
        return reply

    def _step(self, body: dict[str, Any]) -> dict[str, Any]:
        world = _field(body, "world", int)
        step = _field(body, "step", int)
        if world < 1 or step < 0:
            raise BadRequest("world must be positive and step not negative")
        return self.ledger.step(
            _field(body, "worker", str),
            _field(body, "rank", int),
            world,
            step,
            samples=_field(body, "samples", int, 0),
            seconds=_field(body, "seconds", float, 0.0),
        )

    def _commit(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.ledger.commit(_field(body, "checkpoint", str), _field(body, "step", int, None))

    def _restore(self, body: dict[str, Any]) -> dict[str, Any]:
        checkpoint, request_id = _field(body, "checkpoint", str), _field(body, "request_id", str)
        reply = self.ledger.restore(checkpoint, request_id)
        # The ledger reloaded itself from the database, like a service starting: what it
        # dropped may hold cycles, and what it loaded lives on (see collector.py).
        self.collector.sweep()
        self.notify()  # requeued shards: wake the held lease requests
        return reply

    async def _status(self, _request: web.BaseRequest) -> web.StreamResponse:
        self.ledger.reap()
        await self.committer.durable()
        report = job_status(self.ledger.db, self.job)
        report["service"] = {
            "requests": self.requests,
            "commits": self.committer.commits,
            "statements": self.committer.statements,
            "collector": asdict(self.collector.stats),
        }
        return _reply(report)

    async def _health(self, _request: web.BaseRequest) -> web.StreamResponse:
        return _reply({"status": "ok", "job": self.job})


class _Server(web.Server):
    """aiohttp's low-level server, less a reference cycle per closed connection.

    Before Python 3.12, asyncio's socket transport keeps a bound method of
    itself (``_read_ready_cb``) for good: a closed connection's transport and
    socket are then freed only by a cycle collection, which this service runs
    once a minute (see :mod:`guardctl.dds.collector`). Python 3.12 drops it on
    close (python/cpython#100348); this does the same for older ones, when
    the connection is gone and nothing reads from it any more.
    """

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        transport = handler.transport  # still set: the handler tells us before it forgets it
        super().connection_lost(handler, exc)
        callback = getattr(transport, "_read_ready_cb", None)
        if getattr(callback, "__self__", None) is transport:
            transport._read_ready_cb = None  # type: ignore[union-attr]


def _reply(data: dict[str, Any], status: int = 200) -> web.Response:
    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, status=status, content_type=JSON)


async def _reaper(service: Service, period: float) -> None:
    while True:
        await asyncio.sleep(period)
        if service.ledger.reap():
            service.notify()
            await service.committer.durable()


def open_ledger(settings: Settings, job: str, spec: JobSpec | None) -> tuple[Ledger, str]:
    """The job's ledger (created or resumed) and its secret."""
    paths = dds_paths.job_paths(settings, job)
    secret = dds_paths.prepare(paths)
    db = StateDB(paths.state)
    stored = db.meta().get("spec")
    if spec is None:
        if stored is None:
            db.close()
            raise UsageError(
                f"job {job} has no data-sharding state yet: give the dataset (--records or --files)"
            )
        spec = JobSpec.from_json(json.loads(stored))
    ledger = Ledger(db, spec, lease_s=settings.dds.lease_s, halflife=settings.dds.speed_halflife)
    return ledger, secret


async def run_service(
    settings: Settings,
    job: str,
    spec: JobSpec | None,
    *,
    on_ready: Callable[[str, int], None] | None = None,
    linger_s: float | None = None,
    writer: CommitProcess | None = None,
) -> None:
    """Serve *job* until SIGTERM or SIGINT; publish the address once listening.

    With *linger_s*, also stop that long after the job's last shard or step
    is done (so a job step that runs the service can end). With *writer*,
    group commits are written by that process.
    """
    # Handle SIGTERM before anything is published: a stop that arrives just after the
    # address appears must still flush the state and exit cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ledger, secret = open_ledger(settings, job, spec)
    committer = GroupCommit(ledger.db, settings.dds.commit_interval_ms / 1000.0, writer)
    service = Service(ledger, committer, secret.encode(), job)
    runner = web.ServerRunner(service.server(), handle_signals=False)
    await runner.setup()
    # What is loaded by now (modules, a resumed ledger) lives as long as the service.
    service.collector.start()
    site = web.TCPSite(runner, settings.dds.bind, settings.dds.port, backlog=4096)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        service.collector.stop()
        raise StoreError(
            f"cannot listen on {settings.dds.bind}:{settings.dds.port}: {exc}"
        ) from exc
    port = _bound_port(runner)
    host = socket.gethostname() if settings.dds.bind in ("0.0.0.0", "::", "") else settings.dds.bind
    dds_paths.publish_address(dds_paths.job_paths(settings, job), host, port)
    if on_ready is not None:
        on_ready(host, port)
    reaper = asyncio.create_task(_reaper(service, min(settings.dds.lease_s / 4, 1.0)))
    collecting = asyncio.create_task(service.collector.run())
    finished_at: float | None = None
    try:
        while not stop.is_set() and committer.failure is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            if linger_s is not None and ledger.finished:
                finished_at = finished_at or time.monotonic()
                if time.monotonic() - finished_at >= linger_s:
                    break
    finally:
        reaper.cancel()
        collecting.cancel()
        await runner.cleanup()
        service.collector.stop()
        try:
            if committer.failure is None:
                ledger.db.flush()
        finally:
            committer.close()
            ledger.db.close()
    if committer.failure is not None:
        raise StoreError(f"the state database failed: {committer.failure}")


def _bound_port(runner: web.BaseRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise StoreError("the service is not listening on a TCP port")


def raise_open_files_limit(want: int = 65536) -> int:
    """Lift the soft limit on open files toward the hard one: one connection per rank.

    The common default of 1024 would cap a job at about a thousand ranks.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where asked for (or, with "auto", where it is installed)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise UsageError("dds.event_loop = uvloop, but uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def serve(
    settings: Settings,
    job: str,
    spec: JobSpec | None,
    on_ready: Callable[[str, int], None] | None = None,
    linger_s: float | None = None,
) -> None:
    """Run the service in this process until it is told to stop (or lingered after the end)."""
    started = time.monotonic()
    raise_open_files_limit()
    paths = dds_paths.job_paths(settings, job)
    dds_paths.prepare(paths)
    lock = dds_paths.lock_service(paths)
    try:
        # Forked first, while this process has nothing open but the lock.
        writer = CommitProcess(paths.state)
    except OSError as exc:
        lock.close()
        raise StoreError(f"cannot start the commit process: {exc}") from exc
    try:
        with asyncio.Runner(loop_factory=_loop_factory(settings.dds.event_loop)) as runner:
            runner.run(
                run_service(
                    settings, job, spec, on_ready=on_ready, linger_s=linger_s, writer=writer
                )
            )
    except ConflictError as exc:
        raise UsageError(str(exc)) from exc
    finally:
        writer.close()
        lock.close()
    log.info("service for job %s stopped after %.0f s", job, time.monotonic() - started)
