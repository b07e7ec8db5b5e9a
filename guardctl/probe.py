"""Step timing for training scripts: each rank's compute and communication time, per step.

::

    from guardctl import probe

    for batch in loader:
        with probe.step(samples=len(batch)):
            loss = model(batch)
            probe.comm_begin()   # this rank now waits in its gradient collective
            allreduce(gradients_of(loss))
            optimizer.step()

Under PyTorch DDP the all-reduce runs inside ``loss.backward()``, overlapped with
it: a mark after ``backward()`` counts the wait for the slowest rank as every
rank's compute and hides the straggler. Use ``guardctl.torch.instrument(ddp)``,
which marks from DDP's communication hook instead.

Each step becomes a schema-v1 ``step`` record: ``step_s`` (enter to exit of the
``with``), ``compute_s`` (enter to :func:`comm_begin`) and ``comm_s``
(:func:`comm_begin` to exit). In synchronous training every rank's step time is
the same, so a slow rank shows as high ``compute_s`` and low ``comm_s``.

Job, rank and node come from :mod:`guardctl.identity` (torchrun's variables,
then Slurm's; ``GUARDCTL_JOB`` for local runs) unless :func:`configure` says
otherwise, as do the rank's parallel role (``pp_stage``, ``dp_rank``,
``tp_rank``); *samples* says how much work a step was. :func:`last` gives the
last step's times. ``GUARDCTL_STORE`` names the store. A step
costs a few microseconds: it only takes timestamps and appends to a bounded
in-memory queue. A background thread hands the queue over every second; when
the queue is full, steps are dropped and counted, never waited for.
:func:`flush` hands over what is queued; it also runs at exit.

Where the node agent runs, the steps go to it over its node-local socket
(``/run/guardctl/agent.sock``, or ``$GUARDCTL_AGENT_SOCKET``;
:mod:`guardctl.agent.handoff`) and the agent appends them to the store with the
node's own records: ranks never write the shared filesystem. The probe keeps
every step until the agent has answered for it, so an agent that restarts
loses none (up to the queue's size; more are dropped and counted, and the
count goes to the agent's status). Where no agent socket is there (a laptop, a
CI job), or the agent stays unreachable for ``AGENT_WAIT_S``, or it writes
another store, the probe says so once on stderr and writes
``<store>/steps/<job>/`` itself, one file per segment of
``$GUARDCTL_SEGMENT_MINUTES`` minutes (10 when unset or not a divisor of 60;
:mod:`guardctl.storage.segments`). When the store does not take them (a
``steps/`` directory the job's user cannot write, a full disk), the probe says
so once on stderr, keeps them in memory (up to the queue's size) and retries,
and says so again once they are written.

Where no single mark separates a rank's own work from its waiting (FSDP
gathers parameters before every unit's forward, and each gather waits for the
slowest rank), time each collective instead: ``with probe.comm(): ...`` around
it, or :func:`comm_add` with seconds measured elsewhere. A step with such
time has ``comm_s`` = the sum and ``compute_s`` = ``step_s`` minus it;
``comm_begin()`` is then ignored. ``guardctl.torch.fsdp.instrument`` does this
for FSDP2.

With ``configure(cuda_events=True)`` (needs torch with CUDA) the marks are
CUDA events recorded on the current stream, so the times are GPU times; the
flush thread waits for them, never the training loop. Inside ``comm()`` the
current stream is the collective's own (FSDP runs it under its stream), and the
pairs of events are summed in the flush thread.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from guardctl import identity
from guardctl.agent.handoff import AgentLink, Refused, socket_path, store_id
from guardctl.storage import layout, segments
from guardctl.storage.writer import BufferedStore, LineWriter
from guardctl.telemetry.mirror import Mirror
from guardctl.telemetry.schema import dumps, make_record, parse_line

log = logging.getLogger("guardctl.probe")
# The store writer's own outage lines would reach stderr through logging's last resort, or not
# at all where the training script configures logging: the probe says it itself, on stderr.
_writer_log = logging.getLogger("guardctl.probe.store")
_writer_log.propagate = False
_writer_log.addHandler(logging.NullHandler())

ENV_STORE = "GUARDCTL_STORE"
LOCAL_JOB = "local"
DEFAULT_QUEUE = 100_000
# How long steps wait for an agent whose socket is there but does not answer (restarting)
# before the probe writes them to the store itself.
AGENT_WAIT_S = 120.0
# How often a probe without an agent looks for its socket again (an agent started later).
LOOK_EVERY_S = 60.0


@dataclass(frozen=True)
class Role:
    """This rank's part in a parallel job (None where the job does not have that dimension).

    Ranks of one pipeline stage do the same work; different stages do not, so
    the analyzer compares a rank with the ranks of its own stage.
    """

    pp_stage: int | None = None
    dp_rank: int | None = None
    tp_rank: int | None = None

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value is not None and (isinstance(value, bool) or int(value) < 0):
                raise ValueError(f"probe: {name}={value!r} is not a rank or stage number")

    def fields(self) -> dict[str, int]:
        return {k: int(v) for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class StepTimes:
    """The last finished step of this rank, as its record says it."""

    step: int
    step_s: float
    compute_s: float
    comm_s: float
    samples: int | None


def store_from_env() -> Path:
    """``$GUARDCTL_STORE``, else ``store.root`` from guardctl's configuration."""
    if os.environ.get(ENV_STORE):
        return Path(os.environ[ENV_STORE])
    from guardctl.config import load_settings  # only when the variable is not set

    return load_settings().store.root


class _CudaTimer:
    """CUDA events for the three marks; torch is imported only when asked for."""

    def __init__(self) -> None:
        import torch  # optional dependency: the CPU path never imports it

        if not torch.cuda.is_available():
            raise RuntimeError("probe: cuda_events=True but CUDA is not available")
        self.torch = torch

    def mark(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0


class _Comm:
    """``with probe.comm():`` around one collective: its time is added to the step's."""

    __slots__ = ("_probe", "_start")

    def __init__(self, owner: Probe) -> None:
        self._probe = owner
        self._start: Any = None

    def __enter__(self) -> None:
        cuda = self._probe._cuda
        self._start = cuda.mark() if cuda else time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        cuda = self._probe._cuda
        if cuda:  # GPU times: the flush thread waits for the events, not this thread
            self._probe._spans.append((self._start, cuda.mark()))
        else:
            self._probe.comm_add(time.perf_counter() - self._start)


class Probe:
    """Times steps of one rank and writes them to the store from a background thread."""

    def __init__(
        self,
        who: identity.Identity,
        store: Path | None = None,
        *,
        queue_size: int = DEFAULT_QUEUE,
        flush_interval_s: float = 1.0,
        cuda_events: bool = False,
        role: Role | None = None,
        agent_socket: str | None = None,
    ) -> None:
        if queue_size < 1 or flush_interval_s <= 0:
            raise ValueError("probe: queue_size must be >= 1 and flush_interval_s > 0")
        self.who = who
        self.job = who.job or LOCAL_JOB  # outside a job the probe still writes
        layout.step_file(Path("."), self.job, who.node, who.rank, 0.0)  # validate names now
        self.role = role or Role()
        make_record(
            "step", who.node, 0.0, job=self.job, rank=who.rank, step_s=0.0, **self.role.fields()
        )
        self._root = store
        self.queue_size = queue_size
        self.flush_interval_s = flush_interval_s
        self._cuda = _CudaTimer() if cuda_events else None
        self._queue: deque[tuple[Any, ...]] = deque()
        self.dropped = 0
        self._count = 0
        self._number: int | None = None
        self._t0: Any = None
        self._tc: Any = None
        self._samples: int | None = None
        # Time inside collectives in the open step: host seconds, and CUDA event pairs.
        self._comm_s: float | None = None
        self._spans: list[tuple[Any, Any]] = []
        self._last: tuple[Any, ...] | None = None
        self._store: BufferedStore | None = None
        # No settings file here: the length comes with the job's environment.
        self._segment_minutes = segments.minutes_from_env()
        self._segment = -1
        self._path = Path()
        self._head = ""
        self._head_ok = False
        # The node agent's socket ("" for none) and what waits for its answer.
        self._agent_path = socket_path(who.node, agent_socket)
        self._link: AgentLink | None = None
        self._outbox: deque[tuple[float, str]] = deque()
        self._look_at = 0.0
        self._down_since: float | None = None
        self._store_id = ""
        self._said: set[str] = set()
        self.handed_over = 0
        self._reset_thread()

    def _reset_thread(self) -> None:
        # Also called in a forked child: the parent's lock and thread are not ours.
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    # -- the training loop's side: timestamps and an append ---------------

    def step(self, number: int | None = None, samples: int | None = None) -> Probe:
        """Context manager around one training step (*number* defaults to a counter).

        *samples* (or tokens: one unit for the whole job) is the work this rank
        did in the step; :meth:`samples` can also set it inside the step.
        """
        self._number = number
        self._samples = samples
        return self

    def samples(self, count: int) -> None:
        """Record that this rank's current step trains on *count* samples (or tokens)."""
        self._samples = int(count)

    def __enter__(self) -> Probe:
        self._tc = None
        self._comm_s = None
        self._spans = []
        self._t0 = self._cuda.mark() if self._cuda else time.perf_counter()
        return self

    def comm_begin(self) -> None:
        """Mark the moment this rank enters its gradient collective."""
        self._tc = self._cuda.mark() if self._cuda else time.perf_counter()

    def comm(self) -> _Comm:
        """Context manager around one collective: its time counts as communication.

        Once a step has such time, its ``comm_s`` is their sum (not the time
        after :meth:`comm_begin`). Outside a step the time is dropped.
        """
        return _Comm(self)

    def comm_add(self, seconds: float) -> None:
        """Add *seconds* spent inside a collective to the open step's communication time.

        Host seconds, added as they are also under CUDA events: time a collective
        the GPU runs with :meth:`comm`, whose events are on the GPU's clock.
        """
        self._comm_s = (self._comm_s or 0.0) + max(0.0, float(seconds))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        t1 = self._cuda.mark() if self._cuda else time.perf_counter()
        number = self._count if self._number is None else self._number
        self._count += 1
        samples, self._samples = self._samples, None
        if exc_type is not None:
            return  # an aborted step is not a step time
        if self._thread is None or self._pid != os.getpid():
            self._start_thread()
        comm = self._comm_taken()
        item = (number, time.time(), self._t0, self._tc, t1, samples, comm)
        self._last = item
        if len(self._queue) >= self.queue_size:
            self.dropped += 1
            return
        self._queue.append(item)

    def _comm_taken(self) -> tuple[float | None, tuple[tuple[Any, Any], ...]]:
        # The step's collectives, handed to the record; the next step starts empty.
        comm = (self._comm_s, tuple(self._spans))
        self._comm_s, self._spans = None, []
        return comm

    def last(self) -> StepTimes | None:
        """The last finished step's times (None before the first), e.g. for the
        data-sharding client's ``compute_s``. With CUDA events it waits for the
        GPU to finish that step."""
        if self._last is None:
            return None
        number, _, t0, tc, t1, samples, comm = self._last
        step_s, compute_s, comm_s = self._durations(t0, tc, t1, comm)
        return StepTimes(number, step_s, compute_s, comm_s, samples)

    # -- the background side: records and the store ------------------------

    def _start_thread(self) -> None:
        if self._pid != os.getpid():
            # A forked child that steps is a rank of its own: the parent's queue,
            # open files and thread stay the parent's.
            self._reset_thread()
            self._queue.clear()
            self._store = None
            self._link = None  # the parent's connection
            self._outbox.clear()
        self._thread = threading.Thread(target=self._flush_loop, name="guardctl-probe", daemon=True)
        self._thread.start()

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self.flush()

    def _durations(
        self, t0: Any, tc: Any, t1: Any, comm: tuple[float | None, tuple[tuple[Any, Any], ...]]
    ) -> tuple[float, float, float]:
        if self._cuda:
            seconds = self._cuda.seconds
            step_s = seconds(t0, t1)
            compute_s = seconds(t0, tc) if tc is not None else step_s
        else:
            step_s = t1 - t0
            compute_s = (tc - t0) if tc is not None else step_s
        host_s, spans = comm
        if host_s is not None or spans:
            # Time inside collectives, summed: whatever else the step did is the rank's own.
            summed = host_s or 0.0
            if self._cuda:
                summed += sum(self._cuda.seconds(start, end) for start, end in spans)
            compute_s = max(0.0, step_s - summed)
        return step_s, compute_s, max(0.0, step_s - compute_s)

    def _record(self, item: tuple[Any, ...]) -> tuple[float, str]:
        """One queued step as its time and its record's line."""
        number, ts, t0, tc, t1, samples, comm = item
        step_s, compute_s, comm_s = self._durations(t0, tc, t1, comm)
        if not self._head_ok:
            self._set_head()
        return ts, self._line_text(number, ts, step_s, compute_s, comm_s, samples)

    def _set_head(self) -> None:
        # The fixed part of every line, checked once through the schema's make_record; per
        # step only numbers are formatted (µs are plenty).
        who = self.who
        head = dumps(
            make_record(
                "step",
                who.node,
                0.0,
                job=self.job,
                rank=who.rank,
                step=0,
                step_s=0.0,
                compute_s=0.0,
                comm_s=0.0,
                samples=1,
                **self.role.fields(),
            )
        )
        role = "".join(f',"{k}":{v}' for k, v in self.role.fields().items())
        self._head = (
            f'{{"v":1,"kind":"step","node":{json.dumps(who.node)},'
            f'"job":{json.dumps(self.job)},"rank":{int(who.rank)}{role}'
        )
        if parse_line(self._line_text(0, 0.0, 0.0, 0.0, 0.0, 1)) != json.loads(head):
            raise RuntimeError("probe: step line format disagrees with the schema")
        self._head_ok = True

    def _file_of(self, ts: float) -> Path:
        """This rank's own step file for *ts* (written directly, without an agent)."""
        minutes = self._segment_minutes
        segment = int(ts // (minutes * 60))
        if segment != self._segment:
            who = self.who
            self._segment = segment
            self._path = layout.step_file(self.root, self.job, who.node, who.rank, ts, minutes)
            _make_job_dir(self._path.parent)
        return self._path

    def _line_text(
        self,
        number: int,
        ts: float,
        step_s: float,
        compute_s: float,
        comm_s: float,
        samples: int | None,
    ) -> str:
        work = "" if samples is None else f',"samples":{int(samples)}'
        return (
            f'{self._head},"ts":{ts!r},"step":{int(number)},"step_s":{step_s:.6f},'
            f'"compute_s":{compute_s:.6f},"comm_s":{comm_s:.6f}{work}}}'
        )

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = store_from_env()
        return self._root

    def flush(self, *, final: bool = False) -> bool:
        """Hand over every queued step now; True if the agent or the store took them all.

        *final* (at exit): what the agent does not take now is written to the store
        directly, as there is no later. Never raises.
        """
        with self._lock:
            items = []
            while self._queue:
                items.append(self._queue.popleft())
            try:
                lines = [self._record(item) for item in items]
                if self._use_agent():
                    return self._to_agent(lines, final)
                return self._to_store(lines)
            except Exception as exc:  # a training job must never die of its probe
                self.dropped += len(items)
                log.warning("guardctl probe: %d steps dropped: %s", len(items), exc)
                return False

    def _use_agent(self) -> bool:
        """Whether the node's agent takes this rank's steps (its socket is there)."""
        if self._link is not None or not self._agent_path:
            return self._link is not None
        now = time.monotonic()
        if now < self._look_at:
            return False
        self._look_at = now + LOOK_EVERY_S
        link = AgentLink(self._agent_path)
        if link.present():
            self._link = link
            return True
        self._say_once(
            "direct",
            f"no node agent on this node ({self._agent_path} is not there): writing step "
            f"records to {self.root}/steps directly",
        )
        return False

    def _to_agent(self, lines: list[tuple[float, str]], final: bool = False) -> bool:
        assert self._link is not None
        self._outbox.extend(lines)
        over = len(self._outbox) - self.queue_size
        for _ in range(max(0, over)):
            self._outbox.popleft()  # the oldest go first, as the store's buffer does
        self.dropped += max(0, over)
        if not self._outbox:
            return True
        if not self._store_id:
            self._store_id = store_id(self.root)
        try:
            taken = self._link.send(
                [text for _, text in self._outbox], self.dropped, self._store_id
            )
        except Refused as exc:
            for _ in range(exc.taken):
                self._outbox.popleft()  # answered for before the refusal: the agent's
            self._link.close()
            self._link, self._agent_path = None, ""  # for good: this agent is not the rank's
            self._say_once("store", f"{exc}: writing step records to {self.root}/steps directly")
            return self._to_store([])
        self.handed_over += taken
        for _ in range(taken):
            self._outbox.popleft()
        if not self._outbox:
            if self._down_since is not None:
                self._down_since = None
                self._say(f"the node agent at {self._agent_path} takes step records again")
            return True
        now = time.monotonic()
        if final:
            self._say(
                f"the node agent at {self._agent_path} did not take the last "
                f"{len(self._outbox)} steps before exit: writing them to {self.root}/steps"
            )
            return self._to_store([])
        if self._down_since is None:
            self._down_since = now
            self._say(
                f"the node agent at {self._agent_path} does not answer: keeping up to "
                f"{self.queue_size} steps in memory and retrying"
            )
        elif now - self._down_since >= AGENT_WAIT_S:
            self._say_once(
                "gone",
                f"the node agent at {self._agent_path} has not answered for "
                f"{AGENT_WAIT_S:.0f} s: writing the waiting steps to {self.root}/steps directly",
            )
            return self._to_store([])
        return False

    def _to_store(self, lines: list[tuple[float, str]]) -> bool:
        """Write *lines* (after any the agent never took) to this rank's own step file."""
        waiting = list(self._outbox) + lines
        self._outbox.clear()
        if self._store is None:
            writer = LineWriter(mirror=Mirror())  # the analyzer reads the mirror
            self._store = BufferedStore(self.queue_size, _writer_log, writer)
        was_writable = self._store.state.writable
        done = self._store.write((self._file_of(ts), text) for ts, text in waiting)
        self._say_transition(was_writable)
        return done

    def _say(self, text: str) -> None:
        _say(f"guardctl probe: job {self.job} rank {self.who.rank} on {self.who.node}: {text}")

    def _say_once(self, topic: str, text: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            self._say(text)

    def _say_transition(self, was_writable: bool) -> None:
        # Once when the store stops taking this rank's steps, once when it takes them again.
        state = self._store.state if self._store else None
        if state is None or state.writable == was_writable:
            return
        who = f"guardctl probe: job {self.job} rank {self.who.rank} on {self.who.node}"
        if not state.writable:
            hint = ""
            if "EACCES" in state.error or "EPERM" in state.error:
                hint = (
                    f"; {self.root}/steps must be writable by every user (mode 1777, as "
                    "'guardctl store init' makes it)"
                )
            _say(
                f"{who}: cannot write step records: {state.error}{hint}; keeping up to "
                f"{self.queue_size} steps in memory and retrying"
            )
        else:
            _say(f"{who}: step records written again ({state.dropped} steps dropped so far)")

    def stats(self) -> dict[str, int]:
        """Steps queued, handed to the agent, written, waiting, and dropped so far."""
        state = self._store.state if self._store else None
        return {
            "queued": len(self._queue),
            "handed_over": self.handed_over,
            "written": state.written if state else 0,
            "buffered": (state.buffered if state else 0) + len(self._outbox),
            "dropped": self.dropped + (state.dropped if state else 0),
        }


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # no stderr left: nothing more to do
        print(line, file=sys.stderr, flush=True)


def _make_job_dir(directory: Path) -> None:
    # The job's directory is made here with an explicit mode: the rank's umask would otherwise
    # decide whether the controller's analyzer (often run by an operator) can list it. When it
    # cannot be made, the store writer fails on it and says why.
    if directory.is_dir():
        return
    with contextlib.suppress(OSError):  # another rank of the job made it first, or cannot
        directory.mkdir()
        os.chmod(directory, 0o755)


_default: Probe | None = None


def _probe() -> Probe:
    global _default
    if _default is None:
        _default = Probe(identity.from_env())
    return _default


def configure(
    *,
    store: str | os.PathLike[str] | None = None,
    job: str | None = None,
    rank: int | None = None,
    node: str | None = None,
    queue_size: int = DEFAULT_QUEUE,
    flush_interval_s: float = 1.0,
    cuda_events: bool = False,
    pp_stage: int | None = None,
    dp_rank: int | None = None,
    tp_rank: int | None = None,
    agent_socket: str | None = None,
) -> Probe:
    """Set up the module's probe (anything not given comes from the environment).

    *agent_socket* is the node agent's socket (default ``$GUARDCTL_AGENT_SOCKET``, else
    ``/run/guardctl/agent.sock``; ``""``: write the store directly, never through an agent).

    *pp_stage*, *dp_rank* and *tp_rank* are this rank's pipeline stage and
    data- and tensor-parallel ranks, where the job has them: step records carry
    them so that the analyzer compares a rank with the ranks doing the same work.
    """
    global _default
    if _default is not None:
        _default.flush()
    env = identity.from_env()
    who = replace(
        env,
        job=env.job if job is None else str(job),
        rank=env.rank if rank is None else int(rank),
        node=env.node if node is None else node,
    )
    _default = Probe(
        who,
        Path(store) if store is not None else None,
        queue_size=queue_size,
        flush_interval_s=flush_interval_s,
        cuda_events=cuda_events,
        role=Role(pp_stage, dp_rank, tp_rank),
        agent_socket=agent_socket,
    )
    return _default


def step(number: int | None = None, samples: int | None = None) -> Probe:
    """``with probe.step(): ...`` around one training step (*samples*: this rank's work in it)."""
    return _probe().step(number, samples)


def samples(count: int) -> None:
    """Record that the current step trains on *count* samples (or tokens) of this rank."""
    _probe().samples(count)


def last() -> StepTimes | None:
    """The last finished step's step, compute and communication times (None before one)."""
    return _probe().last()


def comm_begin() -> None:
    """Mark the moment this rank enters its gradient collective."""
    _probe().comm_begin()


def comm() -> _Comm:
    """``with probe.comm(): collective()``: its time counts as the step's communication."""
    return _probe().comm()


def comm_add(seconds: float) -> None:
    """Add *seconds* spent inside a collective to the current step's communication time."""
    _probe().comm_add(seconds)


def flush() -> bool:
    """Write every queued step now (also done at exit); True if all were written."""
    return _default.flush() if _default is not None else True


def _flush_at_exit() -> None:
    if _default is not None:
        _default.flush(final=True)


def stats() -> dict[str, int]:
    """Counters of the module's probe: queued, written, buffered, dropped."""
    return _probe().stats()


atexit.register(_flush_at_exit)
