"""The ledger's rules on a real SQLite file: leases, expiry, late acknowledgements, restore."""

from __future__ import annotations

import gc
import sqlite3
from pathlib import Path

import pytest

from guardctl.dds.dataset import JobSpec, index_range
from guardctl.dds.ledger import ConflictError, Ledger
from guardctl.dds.store import StateDB


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(path: Path, clock: Clock, records: int = 40, shard: int = 10, epochs: int = 1) -> Ledger:
    spec = JobSpec(index_range(records), shard, epochs, seed=3)
    ledger = Ledger(StateDB(path / "state.sqlite"), spec, lease_s=5.0, clock=clock)
    return ledger


def reopen(ledger: Ledger, path: Path, clock: Clock) -> Ledger:
    ledger.db.flush()
    ledger.db.close()
    return Ledger(StateDB(path / "state.sqlite"), ledger.spec, lease_s=5.0, clock=clock)


def test_a_retried_lease_request_gets_the_same_shard_even_after_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock)
    first = ledger.lease("w1", "req-1")
    assert ledger.lease("w1", "req-1") == first
    ledger = reopen(ledger, tmp_path, clock)
    again = ledger.lease("w1", "req-1")
    assert (again["lease"], again["shard"]) == (first["lease"], first["shard"])
    assert ledger.lease("w2", "req-2")["shard"] != first["shard"]


def test_expired_lease_goes_back_and_its_late_ack_is_already_done(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=10, shard=10)  # one shard
    slow = ledger.lease("slow", "a")
    assert ledger.lease("fast", "b")["status"] == "wait"
    clock.now += 6
    fast = ledger.lease("fast", "c")
    assert fast["shard"] == slow["shard"] and fast["lease"] != slow["lease"]
    assert ledger.ack(slow["lease"]) == {"status": "expired", "counted": False}
    assert ledger.ack(fast["lease"]) == {"status": "done", "counted": True}
    assert ledger.ack(slow["lease"]) == {"status": "already_done", "counted": False}
    assert ledger.ack(fast["lease"])["counted"] is True  # a retried ack stays counted once
    assert ledger.lease("fast", "d") == {"status": "end"}
    assert ledger.seq == 1


def test_late_ack_counts_when_nobody_took_the_shard_yet(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=20, shard=10)
    late = ledger.lease("w", "a")
    clock.now += 6
    assert ledger.reap() == 1
    assert ledger.ack(late["lease"])["counted"] is True
    other = ledger.lease("w", "b")
    assert other["shard"] != late["shard"]  # the stale queue entry was skipped
    assert ledger.ack(other["lease"])["counted"] is True
    assert ledger.lease("w", "c") == {"status": "end"}


def test_renew_keeps_a_lease_and_revives_an_untaken_expired_one(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=10, shard=10)
    lease = ledger.lease("w", "a")
    clock.now += 4
    assert ledger.renew(lease["lease"])["status"] == "ok"
    clock.now += 4
    assert ledger.reap() == 0
    clock.now += 2
    assert ledger.reap() == 1
    assert ledger.renew(lease["lease"])["status"] == "ok"
    assert ledger.lease("x", "b")["status"] == "wait"


def test_restore_requeues_what_was_done_after_the_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=50, shard=10)
    a = ledger.lease("w", "1")
    ledger.ack(a["lease"])
    ledger.commit("ck1")
    b = ledger.lease("w", "2")
    ledger.ack(b["lease"])
    in_flight = ledger.lease("w", "3")
    ledger = reopen(ledger, tmp_path, clock)
    reply = ledger.restore("ck1", "r1")
    assert reply["requeued"] == 1 and reply["revoked_in_flight"] == 1
    assert ledger.restore("ck1", "r1") == reply  # a retried restore changes nothing more
    assert ledger.ack(b["lease"])["status"] == "revoked"
    assert ledger.ack(in_flight["lease"])["status"] == "revoked"
    seen = {a["shard"]}
    while (lease := ledger.lease("w", f"x{len(seen)}"))["status"] == "leased":
        assert ledger.ack(lease["lease"])["counted"]
        seen.add(lease["shard"])
    assert seen == set(range(5))
    with pytest.raises(ConflictError):
        ledger.restore("nope", "r2")


def test_state_for_another_dataset_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock)
    ledger.db.close()
    with pytest.raises(ConflictError, match="different dataset"):
        make(tmp_path, clock, records=41)


def test_epochs_follow_each_other_and_each_is_complete(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=35, shard=10, epochs=3)
    done: dict[int, list[int]] = {}
    n = 0
    while (lease := ledger.lease("w", f"r{n}"))["status"] == "leased":
        n += 1
        assert ledger.ack(lease["lease"])["counted"]
        done.setdefault(lease["epoch"], []).append(lease["shard"])
    assert {e: sorted(s) for e, s in done.items()} == {e: [0, 1, 2, 3] for e in range(3)}
    assert done[0] != done[1]  # shuffled differently per epoch


def test_an_epoch_done_early_is_passed_when_the_one_before_it_ends(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=20, shard=10, epochs=3)
    slow = ledger.lease("slow", "s")
    other = ledger.lease("w", "o")
    assert ledger.ack(other["lease"])["counted"]
    following = [ledger.lease("w", f"n{i}") for i in range(2)]  # epoch 0 is all handed out
    assert [lease["epoch"] for lease in following] == [1, 1]
    for lease in following:
        assert ledger.ack(lease["lease"])["counted"]
    assert ledger.current == 0
    assert ledger.ack(slow["lease"])["counted"]
    assert ledger.current == 2  # epoch 1 was already complete
    ledger = reopen(ledger, tmp_path, clock)
    assert ledger.current == 2


def test_the_database_holds_what_the_ledger_holds(tmp_path: Path) -> None:
    """Every kind of change (grant, renew, expiry, revival, ack, late ack) reaches the disk."""
    clock = Clock()
    ledger = make(tmp_path, clock, records=100, shard=10, epochs=2)
    a, b, c = (ledger.lease(f"w{i}", f"r{i}") for i in range(3))
    assert ledger.ack(a["lease"])["counted"]
    clock.now += 3
    assert ledger.renew(b["lease"])["status"] == "ok"
    clock.now += 3
    assert ledger.reap() == 1  # c, not the renewed b
    assert ledger.renew(c["lease"])["status"] == "ok"  # revived: nobody took its shard
    d = ledger.lease("w4", "r4")
    assert ledger.ack(b["lease"])["counted"]
    clock.now += 6
    assert ledger.reap() == 2  # c and d
    e = ledger.lease("w5", "r5")
    assert e["shard"] in (c["shard"], d["shard"])  # an expired shard goes first
    assert ledger.ack(e["lease"])["counted"]
    late = c if e["shard"] == c["shard"] else d
    assert ledger.ack(late["lease"]) == {"status": "already_done", "counted": False}
    ledger.commit("ck")

    before = _snapshot(ledger)
    assert _snapshot(reopen(ledger, tmp_path, clock)) == before


def _snapshot(ledger: Ledger) -> dict[str, object]:
    """What a ledger holds, every epoch's shards included, to compare across a reload."""
    epochs = {}
    for number in range(ledger.spec.epochs):
        state = ledger.epoch(number)
        free = {s for s in state.queue if s not in state.done and s not in state.leased}
        epochs[number] = (dict(state.done), dict(state.leased), free)
    return {
        "leases": dict(ledger.leases),
        "by_request": dict(ledger.by_request),
        "epochs": epochs,
        "seq": ledger.seq,
        "current": ledger.current,
        "workers": dict(ledger.workers),
        "checkpoints": dict(ledger.checkpoints),
    }


def test_an_epochs_shards_are_no_objects_for_the_collector(tmp_path: Path) -> None:
    """A full garbage collection must not walk an epoch's shards (millions in a large job)."""
    clock = Clock()
    ledger = make(tmp_path, clock, records=200_000, shard=10)  # 20 000 shards
    assert ledger.lease("w1", "a")["status"] == "leased"
    state = ledger.epoch(0)
    assert sorted(state.order) == list(range(20_000))
    for part in (state.order, state.queue.pending, *ledger._order(0)):
        # An array of machine integers: the collector visits its type, not a shard each.
        assert len(gc.get_referents(part)) <= 1


def test_the_queue_hands_out_requeued_shards_first_then_the_order(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=50, shard=10)  # five shards
    order = list(ledger.epoch(0).order)
    a = ledger.lease("w1", "a")
    b = ledger.lease("w2", "b")
    assert [a["shard"], b["shard"]] == order[:2]
    clock.now += 6  # both expire; they go back to the front, before the untouched shards
    c = ledger.lease("w3", "c")
    assert c["shard"] in order[:2]
    assert ledger.ack(c["lease"])["counted"]
    rest = [ledger.lease("w3", f"r{i}") for i in range(4)]
    assert sorted(r["shard"] for r in rest) == sorted(set(order) - {c["shard"]})
    assert ledger.lease("w3", "r5")["status"] == "wait"  # none free, four in flight
    ledger = reopen(ledger, tmp_path, clock)  # resumed: the queue holds only what is left
    assert list(ledger.epoch(0).queue) == []
    clock.now += 6
    assert ledger.reap() == 4
    assert sorted(ledger.epoch(0).queue) == sorted(r["shard"] for r in rest)


def test_the_expiry_heap_drops_settled_leases_and_still_expires_the_rest(tmp_path: Path) -> None:
    """Acknowledged leases leave expiry entries behind; the heap is rebuilt from the leases
    in flight before they pile up (a sweep of the collector walks every entry)."""
    clock = Clock()
    ledger = make(tmp_path, clock, records=40_000, shard=10)
    kept = []
    for n in range(3000):
        lease = ledger.lease(f"w{n % 8}", f"r{n}")["lease"]
        if n % 600 == 0:
            kept.append(lease)  # five stay in flight
        else:
            assert ledger.ack(lease)["counted"]
        assert len(ledger.heap) <= 1024 + 2 * 5 + 1  # never more than five in flight
    assert ledger.active == set(kept)
    clock.now += 6
    assert ledger.reap() == 5
    assert not ledger.active
    assert {ledger.renew(lease)["status"] for lease in kept} == {"ok"}  # untaken: revived
    ledger.db.close()


def _old_schema(path: Path) -> None:
    """Turn a database into what the version before wrote: shard states in a table of their own."""
    with sqlite3.connect(path / "state.sqlite") as conn:
        conn.executescript(
            """
            CREATE TABLE shard (
                epoch INTEGER NOT NULL, shard INTEGER NOT NULL, state TEXT NOT NULL,
                lease_id INTEGER NOT NULL, done_seq INTEGER, worker TEXT NOT NULL,
                PRIMARY KEY (epoch, shard)) WITHOUT ROWID;
            INSERT INTO shard SELECT epoch, shard, 'done', lease_id, done_seq, worker
                FROM lease WHERE state = 'done';
            INSERT INTO shard SELECT epoch, shard, 'leased', lease_id, NULL, worker
                FROM lease WHERE state = 'active';
            ALTER TABLE lease DROP COLUMN done_seq;
            """
        )


def test_a_database_of_the_earlier_schema_is_taken_over(tmp_path: Path) -> None:
    clock = Clock()
    ledger = make(tmp_path, clock, records=100, shard=10)
    for i in range(3):
        assert ledger.ack(ledger.lease("w", f"a{i}")["lease"])["counted"]
    ledger.commit("ck")
    for i in range(2):
        assert ledger.ack(ledger.lease("w", f"b{i}")["lease"])["counted"]
    ledger.lease("w", "held")
    ledger.lease("w", "lost")
    ledger.renew(ledger.by_request["held"])
    clock.now += 4
    ledger.renew(ledger.by_request["held"])
    clock.now += 2
    assert ledger.reap() == 1  # "lost" expired, its shard queued again
    before = _snapshot(ledger)
    ledger.db.flush()
    ledger.db.close()
    _old_schema(tmp_path)

    ledger = make(tmp_path, clock, records=100, shard=10)
    assert _snapshot(ledger) == before
    tables = {name for (name,) in ledger.db.rows("SELECT name FROM sqlite_master")}
    assert "shard" not in tables and "lease_state" in tables
    reply = ledger.restore("ck", "r")
    assert (reply["requeued"], reply["revoked_in_flight"]) == (2, 1)
    assert len(ledger.epoch(0).done) == 3


def test_an_operation_writes_on_the_last_pages_only(tmp_path: Path) -> None:
    """Leases and acknowledgements in batches of 20 write well under a WAL page each.

    Shards go out in shuffled order; a row per shard state took a random page
    per operation: 1.45 WAL pages per lease + ack here (0.38 without it), 2.3 in
    a larger job, which made the commits and the WAL's restarts that much larger.
    """
    clock = Clock()
    ledger = make(tmp_path, clock, records=500_000, shard=10)
    db = ledger.db
    db.conn.execute("PRAGMA wal_autocheckpoint=0")
    held: list[int] = []

    def run(count: int) -> None:
        for i in range(count):
            held.append(ledger.lease(f"w{i % 64}", f"{len(ledger.leases)}")["lease"])
            if len(held) > 256:
                assert ledger.ack(held.pop(0))["counted"]
            if i % 20 == 19:
                db.flush()

    run(3000)  # the tables past their first pages
    db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    run(2000)
    pages = db.rows("PRAGMA wal_checkpoint(PASSIVE)")[0][1]
    assert pages / 2000 < 1.0, pages
