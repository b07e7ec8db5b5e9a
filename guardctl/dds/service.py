"""``guardctl dds serve``: the HTTP service that hands out one job's shards.

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
import ipaddress
import json
import logging
import math
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from guardctl.config import Settings
from guardctl.dds import paths as dds_paths
from guardctl.dds.collector import Collector
from guardctl.dds.dataset import JobSpec
from guardctl.dds.http_server import Handler, Request, Server
from guardctl.dds.ledger import ConflictError, Ledger
from guardctl.dds.status import read_status
from guardctl.dds.store import CommitProcess, StateDB
from guardctl.errors import ConfigError, GuardctlError, StoreError, UsageError
from guardctl.limits import raise_open_files_limit

try:  # an optional accelerator: the same JSON, parsed and written about twice as fast
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation (tested in a subprocess)
    orjson = None  # type: ignore[assignment]
    _loads = json.loads

log = logging.getLogger("guardctl.dds")

Op = Callable[[dict[str, Any]], dict[str, Any]]
IN_FLIGHT = 2  # batches handed to the commit process at once
LONG_POLL_S = 1.0  # the longest a lease request is held while shards are in flight
MAX_WORLD = 1 << 20  # ranks in a per-step request: a larger world is a client's mistake
INT64 = 1 << 63  # integers in a request must fit the database's (SQLite: signed 64 bits)
FILES_MARGIN = 256  # open files beside the connections: the database, the pipe, the log


class BadRequest(Exception):
    """The request body is not what the endpoint takes."""


Waiter = Callable[["StoreError | None"], None]  # told when its batch is committed, or why not


class GroupCommit:
    """Answers wait here until the batch holding their changes is committed.

    With a :class:`CommitProcess` the batch is committed there while this
    loop goes on serving. Up to ``IN_FLIGHT`` batches are handed over at once
    (the process commits them in order), so it starts the next one without
    waiting for this loop to hear about the last; meanwhile the next batch
    collects. Without a commit process, the batch is committed here, in the loop.

    What waits is a callback (the answer, ready to be written), kept in the
    list of the batch its change is in; when the commit process reports that
    batch, the whole list is called at once: no future or task per request.
    """

    def __init__(self, db: StateDB, interval_s: float, writer: CommitProcess | None = None) -> None:
        self.db = db
        self.interval_s = interval_s
        self.writer = writer
        self.waiters: list[Waiter] = []  # for writes not handed over yet
        # Per batch handed over, oldest first: the answers waiting for it.
        self.in_flight: deque[list[Waiter]] = deque()
        self.scheduled = False
        self.commits = 0
        self.statements = 0
        self.failure: BaseException | None = None
        self.loop = asyncio.get_running_loop()
        if writer is not None:
            self.loop.add_reader(writer.fileno(), self._readable)
            db.before_flush = self.drain

    def after(self, waiter: Waiter) -> bool:
        """Call *waiter* once every change made so far is committed; False if they already are
        (and it is not called). StoreError if the database has failed."""
        if self.failure is not None:
            raise StoreError(f"the state database failed: {self.failure}")
        if self.db.dirty:
            self.waiters.append(waiter)
            self._schedule()
        elif self.in_flight:
            self.in_flight[-1].append(waiter)  # the answer may rest on a batch being committed
        else:
            return False
        return True

    async def durable(self) -> None:
        """Return once every change made so far is committed."""
        fut: asyncio.Future[None] = self.loop.create_future()

        def settle(error: StoreError | None) -> None:
            if not fut.done():
                fut.set_result(None) if error is None else fut.set_exception(error)

        if self.after(settle):
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
        _release(waiters, None)

    def _readable(self) -> None:
        """The pipe from the commit process was readable: take every report there is now.

        Readiness is as of the loop's last poll, and a handler run since (a
        restore commits here, draining the batches in flight first) may have
        taken the report already; a blocking read would then stop the loop
        for good. So each report is read only once it is known to be there.
        """
        assert self.writer is not None
        while self.failure is None and self.writer.ready():
            self._committed()

    def _committed(self) -> None:
        """The commit process reports the oldest batch in flight (blocks until it does)."""
        assert self.writer is not None
        waiters = self.in_flight.popleft() if self.in_flight else []
        try:
            self.statements += self.writer.result()
            self.commits += 1
        except StoreError as exc:
            self._fail(exc, waiters)
            return
        _release(waiters, None)
        if self.waiters or self.db.dirty:
            self._schedule()

    def drain(self) -> None:
        """Wait here for the batches in flight (before this process writes the database itself)."""
        while self.in_flight and self.failure is None:
            self._committed()
        if self.failure is not None:
            raise StoreError(f"the state database failed: {self.failure}")

    def finish(self) -> None:
        """Commit everything here and now, and release every answer waiting (shutting down)."""
        if self.failure is not None:
            return
        waiters, self.waiters = self.waiters, []
        try:
            self.statements += self.db.flush()  # waits for the batches in flight first
        except Exception as exc:
            self._fail(exc, waiters)
            return
        _release(waiters, None)

    def _fail(self, exc: BaseException, waiters: list[Waiter]) -> None:
        log.error("state database commit failed: %s", exc)
        self.failure = exc
        if self.writer is not None:
            self.loop.remove_reader(self.writer.fileno())
        error = StoreError(f"the state database failed: {exc}")
        for batch in [waiters, self.waiters, *self.in_flight]:
            _release(batch, error)
        self.waiters = []
        self.in_flight.clear()

    def close(self) -> None:
        if self.writer is not None:
            if self.failure is None:
                self.loop.remove_reader(self.writer.fileno())
            self.db.before_flush = None
            self.writer.close()


def _release(waiters: list[Waiter], error: StoreError | None) -> None:
    for waiter in waiters:
        try:
            waiter(error)
        except Exception:  # one answer's failure is not the others'
            log.exception("releasing an answer failed")


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = _loads(raw)
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
    # What the database cannot hold would fail the group commit, and with it the service.
    if isinstance(value, int) and not -INT64 <= value < INT64:
        raise BadRequest(f"field {name!r} is out of range")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRequest(f"field {name!r} must be a finite number")
    if isinstance(value, str) and not (0 < len(value) <= 200 and _encodable(value)):
        raise BadRequest(f"field {name!r} must be 1..200 characters of UTF-8")
    return value


def _encodable(text: str) -> bool:
    """Whether *text* is valid UTF-8 (the standard json module lets lone surrogates through)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class Route(NamedTuple):
    method: bytes
    op: Op | None  # takes the JSON body, changes the ledger, returns the reply (then made durable)
    handler: Handler | None  # or answers the request itself (and may take its time)
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
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # long polls, status reports

    @property
    def authorization(self) -> bytes:
        """The ``Authorization`` header of the job's clients (checked by the HTTP server)."""
        return b"Bearer " + self.secret

    def routes(self) -> dict[bytes, Route]:
        """Path -> route, every one behind the secret check."""
        return {
            b"/v1/lease": Route(b"POST", self._lease, None, polls=True),
            b"/v1/renew": Route(b"POST", self._renew, None),
            b"/v1/ack": Route(b"POST", self._ack, None),
            b"/v1/step": Route(b"POST", self._step, None),
            b"/v1/commit": Route(b"POST", self._commit, None),
            b"/v1/restore": Route(b"POST", self._restore, None),
            b"/v1/status": Route(b"GET", None, self._status),
            b"/v1/health": Route(b"GET", None, self._health),
        }

    def handler(self) -> Handler:
        """What the HTTP server calls with each request: check, change the ledger, answer.

        The change is made at once, in the order requests arrive; the answer
        is written when the group commit that holds the change is done.
        """
        routes = self.routes()

        def handle(request: Request) -> None:
            route = routes.get(request.path)
            if route is None:
                path = request.path.decode(errors="replace")
                return _answer(request, {"error": f"no endpoint {path}"}, 404)
            if request.method != route.method:
                path = request.path.decode()
                return _answer(request, {"error": f"{path} takes {route.method.decode()}"}, 405)
            self.requests += 1
            if route.handler is not None:
                return route.handler(request)
            assert route.op is not None
            try:
                body = _parse(request.body)
                reply = route.op(body)
                if route.polls and reply["status"] == "wait":
                    return self._spawn(request, self._long_poll(request, body, reply))
            except (BadRequest, GuardctlError) as exc:
                return _refused(request, exc)
            self._answer_durable(request, reply)

        return handle

    def _answer_durable(self, request: Request, reply: dict[str, Any]) -> None:
        """Answer once the change behind *reply* is committed (at once if nothing changed)."""
        body = _json(reply)

        def committed(error: StoreError | None) -> None:
            if error is None:
                request.answer(200, body)
            else:
                _refused(request, error)

        try:
            if not self.committer.after(committed):
                request.answer(200, body)
        except StoreError as exc:
            _refused(request, exc)

    def _spawn(self, request: Request, work: Coroutine[Any, Any, None]) -> None:
        """Run a request that waits for something other than a commit (rare: not per shard)."""
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self.tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("request %s failed", request.path, exc_info=task.exception())
                _answer(request, {"error": "internal error of the service"}, 500)

        task.add_done_callback(done)

    def _lease(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.ledger.lease(_field(body, "worker", str), _field(body, "request_id", str))

    async def _long_poll(
        self, request: Request, body: dict[str, Any], reply: dict[str, Any]
    ) -> None:
        """No shard is free but some are in flight: hold the lease request until one is.

        Holding it until a lease expires or the job ends (at most about a
        second) saves the worker a sleep-and-retry cycle at the end of a job.
        """
        worker, request_id = body["worker"], body["request_id"]
        deadline = time.monotonic() + LONG_POLL_S
        try:
            while reply["status"] == "wait":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), min(remaining, reply["retry_s"]))
                reply = self.ledger.lease(worker, request_id)
        except (ConflictError, StoreError) as exc:
            return _refused(request, exc)
        self._answer_durable(request, reply)

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
        if not 1 <= world <= MAX_WORLD or step < 0:
            raise BadRequest(f"world must be 1..{MAX_WORLD} and step not negative")
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
        # dropped was frozen and may hold cycles, and what it loaded lives on (collector.py).
        self.collector.sweep(everything=True)
        self.notify()  # requeued shards: wake the held lease requests
        return reply

    def _status(self, request: Request) -> None:
        self._spawn(request, self._report(request))

    async def _report(self, request: Request) -> None:
        try:
            self.ledger.reap()
            await self.committer.durable()
            # Off the loop: its counts scan the lease table (about 1 s at 1.5 million leases),
            # which would stop every request meanwhile; SQLite lets go of the GIL as it reads.
            report = await asyncio.to_thread(read_status, self.ledger.db.path, self.job)
        except StoreError as exc:
            return _refused(request, exc)
        report["service"] = {
            "requests": self.requests,
            "commits": self.committer.commits,
            "statements": self.committer.statements,
            "collector": asdict(self.collector.stats),
        }
        _answer(request, report)

    def _health(self, request: Request) -> None:
        _answer(request, {"status": "ok", "job": self.job})


def _refused(request: Request, exc: Exception) -> None:
    """Answer with what went wrong: the request (400), the database (503), or else what the
    job is (409: its state or how it was started, e.g. per-step without a global batch)."""
    status = (
        400
        if isinstance(exc, BadRequest)
        else 503
        if isinstance(exc, StoreError)
        else 409
        if isinstance(exc, GuardctlError)
        else 500
    )
    _answer(request, {"error": str(exc)}, status)


def _json(data: dict[str, Any]) -> bytes:
    if orjson is not None:
        return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _answer(request: Request, data: dict[str, Any], status: int = 200) -> None:
    request.answer(status, _json(data))


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
    server = Server(service.handler(), service.authorization, settings.dds.max_connections)
    # What is loaded by now (modules, a resumed ledger) lives as long as the service.
    service.collector.start()
    try:
        bind = listen_address(settings.dds.bind)
        port = await server.start(bind, settings.dds.port)
    except (OSError, ConfigError) as exc:
        service.collector.stop()
        committer.close()
        ledger.db.close()
        if isinstance(exc, ConfigError):
            raise
        raise StoreError(f"cannot listen on {bind}:{settings.dds.port}: {exc}") from exc
    host = socket.gethostname() if bind in ("0.0.0.0", "::") else bind
    dds_paths.publish_address(dds_paths.job_paths(settings, job), host, port)
    if on_ready is not None:
        on_ready(host, port)
    reaper = asyncio.create_task(_reaper(service, min(settings.dds.lease_s / 4, 1.0)))
    collecting = asyncio.create_task(service.collector.run())
    try:
        await _until_stopped(stop, committer, ledger, linger_s)
    finally:
        reaper.cancel()
        collecting.cancel()
        server.stop_listening()
        for task in list(service.tasks):
            task.cancel()  # held lease requests and reports: their clients retry elsewhere
        try:
            committer.finish()  # what was changed is committed and answered before closing
        finally:
            await server.close()
            service.collector.stop()
            committer.close()
            ledger.db.close()
    if committer.failure is not None:
        raise StoreError(f"the state database failed: {committer.failure}")


async def _until_stopped(
    stop: asyncio.Event, committer: GroupCommit, ledger: Ledger, linger_s: float | None
) -> None:
    """Until SIGTERM, a failed database, or *linger_s* after the job's last shard or step."""
    finished_at: float | None = None
    while not stop.is_set() and committer.failure is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)
        if linger_s is not None and ledger.finished:
            finished_at = finished_at or time.monotonic()
            if time.monotonic() - finished_at >= linger_s:
                break


def listen_address(bind: str) -> str:
    """Where the service listens: *bind* as set, or (empty) the node's own address.

    The node's own address is the first its hostname resolves to: the one the
    job's ranks on other nodes reach it by, not every interface it has.
    """
    if bind:
        return bind
    name = socket.gethostname()
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(
            f"dds.bind: this node's hostname {name} does not resolve ({exc}); set dds.bind"
        ) from exc
    address = str(found[0][4][0])
    if ipaddress.ip_address(address).is_loopback:
        log.warning(
            "this node's hostname %s resolves to %s, a loopback address: ranks on other "
            "nodes cannot reach the service (set dds.bind)",
            name,
            address,
        )
    return address


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
    # (the common default of 1024 would cap a job at about a thousand ranks)
    raise_open_files_limit(settings.dds.max_connections + FILES_MARGIN)
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
