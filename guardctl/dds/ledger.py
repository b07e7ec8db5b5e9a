"""The service's accounting: which shard is queued, leased or done, per epoch, and why.

The ledger holds the state in memory (the service answers from it) and
queues every change to :class:`StateDB`; on start it rebuilds itself from the
database. Its rules are what make completion exactly-once:

* a shard of an epoch is *done* at most once: the first acknowledgement that
  may count wins, every later one is answered ``already_done``;
* an expired lease goes back to the front of the queue; its late
  acknowledgement still counts if no other worker holds the shard yet;
* ``commit`` remembers the completion sequence number at a checkpoint;
  ``restore`` puts every shard completed after it (and every lease in flight)
  back in the queue, under a new *generation*, so acknowledgements of the
  abandoned timeline are answered ``revoked``; its answer is stored with it, so a
  retried restore (the same request id), even after the service restarted, gets
  the same generation and changes nothing more.
"""

from __future__ import annotations

import heapq
import json
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate, filterfalse
from typing import Any, Final

from guardctl.dds.dataset import JobSpec
from guardctl.dds.memory import ShardQueue, SplitDict, plain_record
from guardctl.dds.split import ewma, rank_speeds, split_batch
from guardctl.dds.store import StateDB
from guardctl.errors import GuardctlError, UsageError


class ConflictError(GuardctlError):
    """The request contradicts the job's state (wrong mode, unknown lease or checkpoint)."""

    exit_code = UsageError.exit_code


# Why a request of the other mode is refused, by the job's own mode.
_WRONG_MODE: Final = {
    "pull": "this job hands out whole shards (pull mode): per-step requests need a service "
    "started with --global-batch",
    "step": "this job hands out each step's part (its service was started with "
    "--global-batch): ask with next_batch() or StepSampler, not for a shard lease",
}

# Whole-row writes (see StateDB.write_latest): the last one per row in a batch is its outcome.
LEASE_COLUMNS = "lease_id, request_id, worker, epoch, shard, gen, granted, expires, state, done_seq"
LEASE_ROW = (
    f"INSERT INTO lease ({LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (lease_id) DO UPDATE SET expires = excluded.expires, state = excluded.state, "
    "done_seq = excluded.done_seq"
)
WORKER_ROW = (
    "INSERT OR REPLACE INTO worker (worker, rank, speed, samples, seconds, shards, last_step, "
    "last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


# A lease is one plain tuple: its row of the lease table (LEASE_ROW's parameters), replaced
# whole when it changes. A job holds millions of leases; a tuple of plain values is kept out
# of the cycle collector's reach (plain_record), so they add nothing to its collections (as
# tracked objects they added about 0.2 s per million leases to every one).
Lease = tuple[int, str, str, int, int, int, float, float, str, int | None]
L_ID: Final = 0
L_REQUEST: Final = 1
L_WORKER: Final = 2
L_EPOCH: Final = 3
L_SHARD: Final = 4
L_GEN: Final = 5
L_GRANTED: Final = 6
L_EXPIRES: Final = 7  # this, L_STATE and L_DONE_SEQ are the only fields that change
L_STATE: Final = 8  # active | done | expired | revoked
L_DONE_SEQ: Final = 9  # the completion's number (see commit), once done


@dataclass
class EpochState:
    order: array[int]
    queue: ShardQueue
    leased: SplitDict[int, int] = field(default_factory=SplitDict)  # shard -> lease id
    done: SplitDict[int, int] = field(default_factory=SplitDict)  # shard -> lease id that counted


@dataclass
class WorkerStat:
    rank: int | None = None
    speed: float | None = None  # samples per second, smoothed
    samples: int = 0
    seconds: float = 0.0
    shards: int = 0
    last_step: int | None = None
    last_seen: float = 0.0


class Ledger:
    """Shards, leases, per-step splits and checkpoints of one job."""

    def __init__(
        self,
        db: StateDB,
        spec: JobSpec,
        *,
        lease_s: float,
        halflife: int = 4,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.lease_s = lease_s
        self.halflife = halflife
        self.clock = clock
        stored = db.meta().get("spec")
        if stored is None:
            db.set_meta("spec", json.dumps(spec.to_json()))
            db.set_meta("gen", "0")
            db.flush()
        elif JobSpec.from_json(json.loads(stored)) != spec:
            raise ConflictError(
                "this job's service already has state for a different dataset, shard size, "
                "epochs or seed; start it without those options to resume, or use a new job id"
            )
        self.spec = spec
        self._one_file = spec.files[0].name if len(spec.files) == 1 else None
        self._orders: dict[int, tuple[array[int], array[int]]] = {}
        self._load()

    # -- loading -----------------------------------------------------------------------------

    def _load(self) -> None:
        meta = self.db.meta()
        self.gen = int(meta.get("gen", "0"))
        # The mode the status shows; the job's dataset (its global batch), not this, decides.
        self.used_mode = meta.get("mode", "")
        # Every lease ever granted, and by its request id: millions, so split (see SplitDict).
        self.leases: SplitDict[int, Lease] = SplitDict()
        self.by_request: SplitDict[str, int] = SplitDict()
        # Expiry entries (expires, lease id), soonest first; an entry whose lease was settled
        # or renewed since stays until it comes up or the heap is compacted (_push).
        self.heap: list[tuple[float, int]] = []
        self.active: set[int] = set()  # the leases in flight
        # Each epoch's shards held or done, from the leases (an epoch's state is built from
        # them on first use): an active lease holds its shard, a done one completed it.
        self._rows: dict[tuple[int, str], list[tuple[int, int]]] = {}
        self.seq = 0
        stored: list[Lease] = [
            plain_record(row) for row in self.db.rows(f"SELECT {LEASE_COLUMNS} FROM lease")
        ]
        self.leases.fill((lease[L_ID], lease) for lease in stored)
        self.by_request.fill((lease[L_REQUEST], lease[L_ID]) for lease in stored)
        for lease in stored:
            state = lease[L_STATE]
            if state == "active":
                self.active.add(lease[L_ID])
                heapq.heappush(self.heap, plain_record((lease[L_EXPIRES], lease[L_ID])))
                self._held(lease, "leased")
            elif state == "done":
                self.seq = max(self.seq, lease[L_DONE_SEQ] or 0)
                self._held(lease, "done")
        self.next_lease = max(self.leases, default=0) + 1
        self.epochs: dict[int, EpochState] = {}
        self.current = 0
        while self.current < self.spec.epochs and self._complete(self.current):
            self.current += 1
        self.workers: dict[str, WorkerStat] = {}
        for name, rank, speed, samples, seconds, shards, last_step, seen in self.db.rows(
            "SELECT worker, rank, speed, samples, seconds, shards, last_step, last_seen FROM worker"
        ):
            self.workers[name] = WorkerStat(rank, speed, samples, seconds, shards, last_step, seen)
        self.steps = {s: json.loads(v) for s, v in self.db.rows("SELECT step, shares FROM step")}
        self.checkpoints = {
            name: (ord_, seq, step)
            for name, ord_, seq, step in self.db.rows("SELECT name, ord, seq, step FROM checkpoint")
        }
        self.restores: dict[str, dict[str, Any]] = {
            request_id: json.loads(reply)
            for request_id, reply in self.db.rows("SELECT request_id, reply FROM restore")
        }
        self.steps_ended = False

    def _held(self, lease: Lease, kind: str) -> None:
        self._rows.setdefault((lease[L_EPOCH], kind), []).append((lease[L_SHARD], lease[L_ID]))

    def _order(self, epoch: int) -> tuple[array[int], array[int]]:
        """The epoch's shard order and the stream end of each shard in it (cached).

        Arrays, not lists: see :class:`ShardQueue`.
        """
        if epoch not in self._orders:
            order = array("q", self.spec.epoch_order(epoch))
            ends = array("q", accumulate(self.spec.shard_len(s) for s in order))
            self._orders = {epoch: (order, ends), **dict(list(self._orders.items())[-3:])}
        return self._orders[epoch]

    def epoch(self, epoch: int) -> EpochState:
        """The epoch's live state, built on first use from the rows stored for it."""
        state = self.epochs.get(epoch)
        if state is None:
            order = self._order(epoch)[0]
            done: SplitDict[int, int] = SplitDict()
            leased: SplitDict[int, int] = SplitDict()
            done.fill(self._rows.pop((epoch, "done"), ()))
            leased.fill(self._rows.pop((epoch, "leased"), ()))
            pending = order
            if done or leased:  # resumed: only what is left (a fresh epoch shares the order)
                taken = done.key_set() | leased.key_set()
                pending = array("q", filterfalse(taken.__contains__, order))
            state = EpochState(order, ShardQueue(pending), leased, done)
            self.epochs[epoch] = state
        return state

    @property
    def finished(self) -> bool:
        """Every epoch is done (pull mode), or a rank has been told the last step is past."""
        return self.current >= self.spec.epochs or self.steps_ended

    def _complete(self, epoch: int) -> bool:
        return len(self.epoch(epoch).done) >= self.spec.shards

    # -- pull mode ---------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``step`` for a job started with a global batch, else ``pull``: fixed with the job."""
        return "step" if self.spec.global_batch > 0 else "pull"

    def _use_mode(self, mode: str) -> None:
        """Refuse a request of the other mode before it changes anything.

        The mode comes from how the service was started (``--global-batch``),
        never from the first request, so a stray request of the other kind
        cannot turn the job over; a state stored otherwise by an older service
        is corrected at the first request of the job's own mode.
        """
        if mode != self.mode:
            raise ConflictError(_WRONG_MODE[self.mode])
        if self.used_mode != mode:
            self.used_mode = mode
            self.db.set_meta("mode", mode)

    def lease(self, worker: str, request_id: str) -> dict[str, Any]:
        """Lease the next shard to *worker*; a retried *request_id* gets the same answer."""
        known = self.by_request.get(request_id)
        if known is not None:
            return self._lease_reply(self.leases[known])
        self._use_mode("pull")
        now = self.clock()
        if self.heap and self.heap[0][0] <= now:
            self.reap(now)
        self._seen(worker, now)
        for number in (self.current, self.current + 1):
            if number >= self.spec.epochs:
                break
            state = self.epoch(number)
            queue, done, leased = state.queue, state.done, state.leased
            while queue:
                shard = queue.popleft()
                if shard not in done and shard not in leased:
                    lease = self._grant(worker, request_id, state, number, shard, now)
                    return self._lease_reply(lease, now)
        if self.current >= self.spec.epochs:
            return {"status": "end"}
        soonest = self.heap[0][0] if self.heap else now + 1.0  # the heap's first is its minimum
        return {"status": "wait", "retry_s": round(min(max(soonest - now, 0.05), 1.0), 3)}

    def _grant(
        self, worker: str, request_id: str, state: EpochState, epoch: int, shard: int, now: float
    ) -> Lease:
        lease_id = self.next_lease
        self.next_lease += 1
        expires = now + self.lease_s
        lease = plain_record(
            (lease_id, request_id, worker, epoch, shard, self.gen, now, expires, "active", None)
        )
        self.leases[lease_id] = lease
        self.by_request[request_id] = lease_id
        state.leased[shard] = lease_id
        self.active.add(lease_id)
        self._push(expires, lease_id)
        self.db.write_latest(("lease", lease_id), LEASE_ROW, lease)
        return lease

    def _update(
        self, lease: Lease, expires: float, state: str, done_seq: int | None = None
    ) -> Lease:
        """Replace a lease's changing fields, in memory and (at the next commit) on disk."""
        lease = plain_record((*lease[:L_EXPIRES], expires, state, done_seq))
        self.leases[lease[L_ID]] = lease
        if state == "active":
            self.active.add(lease[L_ID])
        else:
            self.active.discard(lease[L_ID])
        self.db.write_latest(("lease", lease[L_ID]), LEASE_ROW, lease)
        return lease

    def _push(self, expires: float, lease_id: int) -> None:
        """Add an expiry entry; first drop the stale ones once they are most of the heap.

        Acknowledged leases leave their entries behind until they would have
        expired: with long leases, millions, which every sweep of the collector
        walked (50 ns each). Rebuilding from the leases in flight costs as much
        as the entries that piled up since the last rebuild.
        """
        if len(self.heap) > 2 * len(self.active) + 1024:
            leases = self.leases
            self.heap = [plain_record((leases[i][L_EXPIRES], i)) for i in self.active]
            heapq.heapify(self.heap)
        heapq.heappush(self.heap, plain_record((expires, lease_id)))

    def _lease_reply(self, lease: Lease, now: float | None = None) -> dict[str, Any]:
        start, end = self.spec.shard_bounds(lease[L_SHARD])
        if self._one_file is not None:  # the common case, without the general lookup
            pieces = [[self._one_file, start, end]]
        else:
            pieces = [[p.file, p.start, p.end] for p in self.spec.locate(start, end)]
        now = self.clock() if now is None else now
        return {
            "status": "leased",
            "lease": lease[L_ID],
            "epoch": lease[L_EPOCH],
            "shard": lease[L_SHARD],
            "start": start,
            "end": end,
            "pieces": pieces,
            "expires_in": round(max(lease[L_EXPIRES] - now, 0.0), 3),
            "lease_s": self.lease_s,
            "state": lease[L_STATE],
        }

    def _known_lease(self, lease_id: int) -> Lease:
        lease = self.leases.get(lease_id)
        if lease is None:
            raise ConflictError(f"unknown lease {lease_id}")
        return lease

    def renew(self, lease_id: int) -> dict[str, Any]:
        """Extend a lease; an expired one whose shard nobody took yet is revived."""
        lease = self._known_lease(lease_id)
        now = self.clock()
        outcome = self._settled(lease)
        if outcome is not None:
            return {"status": outcome}
        epoch, shard, worker = lease[L_EPOCH], lease[L_SHARD], lease[L_WORKER]
        if lease[L_STATE] == "expired":
            state = self.epoch(epoch)
            if shard in state.leased:
                return {"status": "expired"}
            state.leased[shard] = lease_id  # its stale queue entry is skipped
        expires = now + self.lease_s
        self._update(lease, expires, "active")
        self._push(expires, lease_id)
        self._seen(worker, now)
        return {"status": "ok", "expires_in": self.lease_s}

    def _settled(self, lease: Lease) -> str | None:
        """The answer for a lease whose shard is already decided, else None."""
        if lease[L_GEN] != self.gen or lease[L_STATE] == "revoked":
            return "revoked"
        done_by = self.epoch(lease[L_EPOCH]).done.get(lease[L_SHARD])
        if done_by is not None:
            return "done" if done_by == lease[L_ID] else "already_done"
        return None

    def ack(self, lease_id: int) -> dict[str, Any]:
        """Record that a lease's shard was processed; say whether that completion counts."""
        lease = self._known_lease(lease_id)
        outcome = self._settled(lease)
        if outcome is not None:
            return {"status": outcome, "counted": outcome == "done"}
        state = self.epoch(lease[L_EPOCH])
        holder = state.leased.get(lease[L_SHARD])
        if holder is not None and holder != lease_id:
            return {"status": "expired", "counted": False}
        self._complete_shard(lease, state)
        return {"status": "done", "counted": True}

    def _complete_shard(self, lease: Lease, state: EpochState) -> None:
        now = self.clock()
        self.seq += 1
        epoch, shard, worker = lease[L_EPOCH], lease[L_SHARD], lease[L_WORKER]
        state.leased.pop(shard, None)
        state.done[shard] = lease[L_ID]
        self._update(lease, lease[L_EXPIRES], "done", self.seq)
        samples = self.spec.shard_len(shard)
        # The service's own view of speed: from grant to acknowledgement, on its clock.
        self._measure(worker, samples, max(now - lease[L_GRANTED], 1e-6), now, shards=1)
        if epoch == self.current:  # only the current epoch's completion moves it on
            while self.current < self.spec.epochs and self._complete(self.current):
                self.current += 1

    def reap(self, now: float | None = None) -> int:
        """Put every lease past its expiry back at the front of its epoch's queue."""
        now = self.clock() if now is None else now
        count = 0
        while self.heap and self.heap[0][0] <= now:
            _expires, lease_id = heapq.heappop(self.heap)
            lease = self.leases[lease_id]
            if lease[L_STATE] != "active" or lease[L_EXPIRES] > now or lease[L_GEN] != self.gen:
                continue  # renewed (a newer heap entry exists) or settled
            self._update(lease, lease[L_EXPIRES], "expired")
            epoch, shard = lease[L_EPOCH], lease[L_SHARD]
            state = self.epoch(epoch)
            if state.leased.get(shard) == lease_id:
                del state.leased[shard]
                state.queue.appendleft(shard)
            count += 1
        return count

    # -- per-step mode -----------------------------------------------------------------------

    def step(
        self,
        worker: str,
        rank: int,
        world: int,
        step: int,
        samples: int = 0,
        seconds: float = 0.0,
    ) -> dict[str, Any]:
        """The part of global step *step* that *rank* processes, split by measured speed.

        *samples* and *seconds* report the rank's previous part and how long it
        took to compute (not counting waiting for the other ranks).
        """
        if not 0 <= rank < world:
            raise ConflictError(f"rank {rank} is outside a world of {world}")
        self._use_mode("step")
        spe = self.spec.steps_per_epoch
        now = self.clock()
        if samples > 0 and seconds > 0:
            self._measure(worker, samples, seconds, now, rank=rank)
        self._seen(worker, now, rank=rank, last_step=step)
        if step >= spe * self.spec.epochs:
            self.steps_ended = True
            return {"status": "end"}
        epoch, within = divmod(step, spe)
        size = min(self.spec.global_batch, self.spec.total - within * self.spec.global_batch)
        shares = self.steps.get(step)
        if shares is None:
            shares = split_batch(size, rank_speeds(world, self._rank_speeds()))
            self.steps[step] = shares
            self.db.write(
                "INSERT OR REPLACE INTO step (step, shares) VALUES (?, ?)",
                (step, json.dumps(shares)),
            )
        if len(shares) != world:
            raise ConflictError(f"step {step} was split among {len(shares)} ranks, not {world}")
        order, ends = self._order(epoch)
        lo = within * self.spec.global_batch + sum(shares[:rank])
        ranges = self.spec.stream_ranges(order, lo, lo + shares[rank], ends=ends)
        return {
            "status": "ok",
            "step": step,
            "epoch": epoch,
            "share": shares[rank],
            "weight": shares[rank] / size,
            "batch": size,
            "shares": shares,
            "ranges": ranges,
        }

    def _rank_speeds(self) -> dict[int, float]:
        speeds: dict[int, tuple[float, float]] = {}
        for stat in self.workers.values():
            if stat.rank is not None and stat.speed:
                # Several workers may have held a rank (restarts): the freshest one counts.
                old = speeds.get(stat.rank)
                if old is None or stat.last_seen > old[1]:
                    speeds[stat.rank] = (stat.speed, stat.last_seen)
        return {r: v for r, (v, _) in speeds.items()}

    # -- workers -----------------------------------------------------------------------------

    def _stat(self, worker: str) -> WorkerStat:
        stat = self.workers.get(worker)
        if stat is None:
            stat = self.workers[worker] = WorkerStat()
        return stat

    def _seen(
        self, worker: str, now: float, rank: int | None = None, last_step: int | None = None
    ) -> None:
        stat = self._stat(worker)
        stat.last_seen = now
        if rank is not None:
            stat.rank = rank
        if last_step is not None:
            stat.last_step = last_step
        self._save_worker(worker, stat)

    def _measure(
        self,
        worker: str,
        samples: int,
        seconds: float,
        now: float,
        *,
        rank: int | None = None,
        shards: int = 0,
    ) -> None:
        stat = self._stat(worker)
        stat.speed = ewma(stat.speed, samples / seconds, self.halflife)
        stat.samples += samples
        stat.seconds += seconds
        stat.shards += shards
        stat.last_seen = now
        if rank is not None:
            stat.rank = rank
        self._save_worker(worker, stat)

    def _save_worker(self, worker: str, stat: WorkerStat) -> None:
        self.db.write_latest(
            ("worker", worker),
            WORKER_ROW,
            (
                worker,
                stat.rank,
                stat.speed,
                stat.samples,
                stat.seconds,
                stat.shards,
                stat.last_step,
                stat.last_seen,
            ),
        )

    # -- checkpoints -------------------------------------------------------------------------

    def commit(self, name: str, step: int | None = None) -> dict[str, Any]:
        """Tie the completions so far to checkpoint *name* (idempotent)."""
        if not name:
            raise ConflictError("a checkpoint needs a name")
        known = self.checkpoints.get(name)
        if known is None:
            ord_ = max((o for o, _, _ in self.checkpoints.values()), default=0) + 1
            known = (ord_, self.seq, step)
            self.checkpoints[name] = known
            self.db.write(
                "INSERT INTO checkpoint (name, ord, seq, step, gen, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (name, ord_, self.seq, step, self.gen, self.clock()),
            )
        return {"status": "ok", "checkpoint": name, "seq": known[1], "step": known[2]}

    def restore(self, name: str, request_id: str) -> dict[str, Any]:
        """Roll the accounting back to checkpoint *name*: later completions are queued again."""
        if request_id in self.restores:
            return self.restores[request_id]
        known = self.checkpoints.get(name)
        if known is None:
            raise ConflictError(f"unknown checkpoint {name!r}")
        ord_, seq, step = known
        self.db.flush()
        # The revoked keep their done_seq: the record of what the abandoned timeline did.
        later = "done_seq > ? AND state = 'done'"
        requeued = self.db.rows(f"SELECT COUNT(*) FROM lease WHERE {later}", (seq,))[0][0]
        in_flight = self.db.rows("SELECT COUNT(*) FROM lease WHERE state = 'active'")[0][0]
        self.db.write("UPDATE lease SET state = 'revoked' WHERE state = 'active'")
        self.db.write(f"UPDATE lease SET state = 'revoked' WHERE {later}", (seq,))
        if step is not None:
            self.db.write("DELETE FROM step WHERE step >= ?", (step,))
        self.db.write("DELETE FROM checkpoint WHERE ord > ?", (ord_,))
        self.db.set_meta("gen", str(self.gen + 1))
        reply = {
            "status": "ok",
            "checkpoint": name,
            "step": step,
            "requeued": int(requeued),
            "revoked_in_flight": int(in_flight),
            "gen": self.gen + 1,
        }
        # In the restore's transaction: committed with it, or neither is.
        self.db.write(
            "INSERT INTO restore (request_id, reply) VALUES (?, ?)", (request_id, json.dumps(reply))
        )
        self.db.flush()
        self._orders.clear()
        self._load()  # (which reads the answers back, this one with them)
        return reply
