"""The action log on a store that fills up, tears a line, or grows without end.

A write that fails or comes up short is taken back, and an append after a fragment starts on a
line of its own: no entry is ever swallowed. The log is read once per process and then only
what was appended; past a size it is checkpointed to the entries that still matter.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from guardctl import actionlog
from guardctl.actionlog import ActionLog, Entry, pending_intents
from guardctl.config import Layer, Settings, build_settings
from guardctl.controller.ladder import derive
from guardctl.errors import StoreError
from guardctl.nodeops import NodeOps
from guardctl.nodeops.ownership import Snapshot
from guardctl.slurm.memory import MemorySlurm


def settings(root: Path) -> Settings:
    return build_settings(
        [
            Layer(
                "test",
                {
                    "store": {"root": str(root)},
                    "safety": {"max_out_nodes": 8, "max_out_fraction": 1.0},
                },
            )
        ]
    )


def lines(log: ActionLog) -> list[str]:
    return log.path.read_text().split("\n")


def test_a_short_write_is_taken_back_and_the_next_entry_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = ActionLog(tmp_path)
    first = log.record("quarantine", "intent", ["node1"], reason="guardctl: slow")
    size = log.path.stat().st_size
    real_write = os.write
    calls: list[int] = []

    def short(fd: int, data: bytes) -> int:  # the disk fills up halfway through the line
        calls.append(len(data))
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(actionlog.os, "write", short)
    with pytest.raises(StoreError):
        log.record("quarantine", "done", ["node1"], entry_id=first.id)
    monkeypatch.setattr(actionlog.os, "write", real_write)
    assert calls and log.path.stat().st_size == size  # nothing of it is left behind
    later = log.record("drain", "intent", ["node2"], reason="guardctl: failed sweep")
    assert [e.id for e in ActionLog(tmp_path).entries()] == [first.id, later.id]
    assert [e.id for e in pending_intents(ActionLog(tmp_path).entries())] == [first.id, later.id]


def test_an_append_after_a_torn_fragment_starts_its_own_line(tmp_path: Path) -> None:
    log = ActionLog(tmp_path)
    first = log.record("quarantine", "intent", ["node1"])
    with open(log.path, "ab") as f:  # what a writer killed mid-line (or an older guardctl) left
        f.write(b'{"id":"torn","ts":1.0,"action":"drain","pha')
    later = log.record("quarantine", "done", ["node1"], entry_id=first.id)
    assert [(e.id, e.phase) for e in ActionLog(tmp_path).entries()] == [
        (first.id, "intent"),
        (later.id, "done"),
    ]
    assert lines(log)[1].startswith('{"id":"torn"')  # the fragment kept, on a line of its own


@pytest.fixture
def tiny_store(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 64 KiB (tmpfs), mounted for the test: root only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "store"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_store_full_mid_append_loses_no_entry(tiny_store: Path) -> None:
    log = ActionLog(tiny_store)
    log.record("quarantine", "intent", ["node1"])
    filler = tiny_store / "filler"
    with open(filler, "wb", buffering=0) as f:  # another file fills the store up
        try:
            while True:
                f.write(b"x" * 512)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with pytest.raises(StoreError):
        for _ in range(200):
            log.record(
                "control decision", "note", ["node1"], reason="x" * 300, evidence={"pad": "y" * 300}
            )
    text = log.path.read_text()
    assert text.endswith("\n")  # the failed line is taken back whole
    kept = ActionLog(tiny_store).entries()
    assert len(kept) == text.count("\n")  # every line is a whole entry
    filler.unlink()  # an operator frees space
    after = log.record("drain", "intent", ["node2"], reason="guardctl: failed sweep")
    assert ActionLog(tiny_store).entries()[-1].id == after.id
    assert ActionLog(tiny_store).entries()[:-1] == kept


def _entry(
    ts: float,
    action: str,
    phase: str,
    nodes: list[str],
    *,
    reason: str = "",
    eid: str | None = None,
    **evidence: Any,
) -> Entry:
    return Entry(
        eid or uuid.uuid4().hex[:16],
        ts,
        action,
        phase,
        tuple(nodes),
        "ops@h",
        "h",
        1,
        reason,
        dict(evidence),
    )


def _history(now: float, months: int = 2) -> list[Entry]:
    """A controller's months on 40 nodes, ending with what it still holds."""
    out: list[Entry] = []
    start = now - months * 30 * 86400
    for day in range(months * 30):
        t = start + day * 86400
        for i in range(40):
            node = f"node{i}"
            out.append(_entry(t + i, "control pass", "note", [node]))
            out.append(
                _entry(
                    t + i + 1, "control decision", "note", [node], decision="wait", why=f"day {day}"
                )
            )
            if (day + i) % 9 == 0:
                q = uuid.uuid4().hex[:16]
                out += [
                    _entry(
                        t + i + 2,
                        "quarantine",
                        "intent",
                        [node],
                        eid=q,
                        by="control",
                        reservation=f"guardctl_q_{node}",
                    ),
                    _entry(
                        t + i + 3,
                        "quarantine",
                        "done",
                        [node],
                        eid=q,
                        by="control",
                        reservation=f"guardctl_q_{node}",
                    ),
                    _entry(
                        t + i + 4,
                        "control sweep",
                        "note",
                        [node],
                        verdict="pass" if i % 2 else "fail",
                        sweep=f"s{day}{i}",
                    ),
                ]
                if i % 2:
                    out.append(
                        _entry(
                            t + i + 5, "release", "done", [node], reservation=f"guardctl_q_{node}"
                        )
                    )
                else:
                    out += [
                        _entry(t + i + 5, "drain", "done", [node], reason="guardctl: fail"),
                        _entry(
                            t + i + 6,
                            "release",
                            "done",
                            [node],
                            because="drained",
                            reservation=f"guardctl_q_{node}",
                        ),
                    ]
                    if day < months * 30 - 5:  # repaired, resumed
                        out.append(_entry(t + i + 7, "resume", "done", [node]))
    old = now - 40 * 86400
    out += [
        _entry(old, "drain", "intent", ["node3"], reason="guardctl: x"),  # never closed
        _entry(
            old,
            "sweep reserve",
            "done",
            ["node5", "node6"],
            sweep="s-old",
            reservation="guardctl_s_old_1",
            partners=["node6"],
        ),
        _entry(old, "control sweeping", "note", ["node5"], sweep="s-old"),
        _entry(old, "sweep jobs", "note", ["node5"], sweep="s-old", jobs={"7": "gemm"}),
    ]
    return sorted(out, key=lambda e: e.ts)


def test_a_checkpoint_keeps_what_holds_and_the_ladder_need(tmp_path: Path) -> None:
    from guardctl.nodeops import checkpoint

    now = time.time()
    log = ActionLog(tmp_path, clock=lambda: now)
    log.path.parent.mkdir(parents=True)
    everything = _history(now)
    log.path.write_text("".join(e.to_json() + "\n" for e in everything))
    before = log.path.read_bytes()
    log.checkpoint(lambda entries: checkpoint.keep(entries, settings(tmp_path), now))
    kept = ActionLog(tmp_path).entries()
    assert len(kept) < len(everything) / 3
    (archive,) = (tmp_path / "actions" / "archive").iterdir()
    assert archive.read_bytes() == before  # the whole old log, kept aside
    full, cut = Snapshot({}, []), Snapshot({}, [])
    full.apply_log(everything)
    cut.apply_log(kept)
    for attr in ("drained_by_us", "quarantined_by_us", "drained_in_quarantine", "pending_out"):
        assert getattr(cut, attr) == getattr(full, attr), attr
    assert cut.swept_by_us.keys() == full.swept_by_us.keys() == {"guardctl_s_old_1"}
    assert [e.id for e in pending_intents(kept)] == [e.id for e in pending_intents(everything)]
    ladders_full, ladders_cut = derive(everything), derive(kept)
    week = now - 7 * 86400
    for node, lad in ladders_full.items():
        got = ladders_cut[node]
        assert (
            got.quarantined_by_control,
            got.quarantined_at,
            got.last_pass(),
            got.fresh_start,
            got.last_decision,
            got.rebalance,
            got.sweeping,
        ) == (
            lad.quarantined_by_control,
            lad.quarantined_at,
            lad.last_pass(),
            lad.fresh_start,
            lad.last_decision,
            lad.rebalance,
            lad.sweeping,
        ), node
        assert got.passes_since(week) == lad.passes_since(week)
        assert got.onsets_since(now - 3600) == lad.onsets_since(now - 3600)
    assert any(e.action == "sweep jobs" for e in kept)  # its open sweep's jobs, to cancel


def test_a_pass_reads_the_log_once_then_only_what_was_appended(tmp_path: Path) -> None:
    log = ActionLog(tmp_path)
    log.path.parent.mkdir(parents=True)
    now = time.time()
    with open(log.path, "w") as f:  # a big log: 40k entries
        for i in range(40_000):
            f.write(
                _entry(
                    now - 10 * 86400 + i,
                    "control decision",
                    "note",
                    [f"node{i % 50}"],
                    why="w" * 100,
                ).to_json()
                + "\n"
            )
    size = log.path.stat().st_size

    def read_bytes() -> int:
        with open("/proc/self/io") as io:
            return int(next(line for line in io if line.startswith("rchar:")).split()[1])

    first = read_bytes()
    assert len(log.entries()) == 40_000
    assert read_bytes() - first >= size
    log.record("drain", "intent", ["node1"])
    again = read_bytes()
    for _ in range(10):  # what one pass's reads (snapshot, rate, ladder, cap) cost
        got = log.entries()
    assert read_bytes() - again < size / 10
    assert len(got) == 40_001 and got[-1].action == "drain"


def test_an_acting_command_checkpoints_a_log_past_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from guardctl.nodeops import actions

    slurm = MemorySlurm([f"node{i}" for i in range(40)])
    clock = [time.time() - 30 * 86400]
    ops = NodeOps(settings(tmp_path), slurm, clock=lambda: clock[0])
    ops.quarantine(["node1"])
    for i in range(300):  # a month ago
        ops.record("control decision", [f"node{i % 40}"], reason="w" * 200)
    clock[0] = time.time()
    monkeypatch.setattr(actions, "CHECKPOINT_BYTES", 20_000)
    size = ops.log.size()
    ops.status()  # reading: never
    assert not (tmp_path / "actions" / "archive").exists()
    ops.quarantine(["node2"])
    (archive,) = (tmp_path / "actions" / "archive").iterdir()
    assert archive.stat().st_size >= size and ops.log.size() < size / 4
    assert {s.name: s.owner for s in ops.status()}["node1"] == "quarantined"
    assert [r.name for r in slurm.reservations()] == ["guardctl_q_node1", "guardctl_q_node2"]
    assert ops.log.entries()[-1].action == "quarantine"


def test_a_reader_that_saw_a_line_later_taken_back_reads_the_next_one(tmp_path: Path) -> None:
    writer, reader = ActionLog(tmp_path), ActionLog(tmp_path)
    writer.record("quarantine", "intent", ["node1"])
    size = writer.path.stat().st_size
    writer.record("quarantine", "done", ["node1"], reason="x")
    assert len(reader.entries()) == 2  # read in the moment before its fsync failed
    os.truncate(writer.path, size)  # what the failed write's clean-up does
    later = writer.record("drain", "intent", ["node2"], reason="guardctl: a longer reason")
    assert [e.phase for e in reader.entries()] == ["intent", "intent"]
    assert reader.entries()[-1].id == later.id
