"""The controller's leader closes the store's ended segments after its pass; nobody else does.

Real controller over the in-memory Slurm, real store files: a job's telemetry ending now in
10-minute segments, so that the segments before the newest have ended.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from controltools import Trace

from guardctl.analyze.engine import Analysis
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.load import read_frame, source_files
from guardctl.clock import Clock
from guardctl.config import Layer, Settings, build_settings
from guardctl.controller.loop import Controller
from guardctl.slurm.memory import MemorySlurm
from guardctl.storage import closed, layout, segments
from guardctl.storage import store as shared_store
from guardctl.storage.source import StoreSource
from guardctl.telemetry import schema

NODES = [f"node{i}" for i in range(1, 5)]


def telemetry(store: Path, *, ago_s: float = 0.0, minutes: int = 25) -> None:
    """A job on four nodes whose telemetry ends *ago_s* before now, in 10-minute segments."""
    tr = Trace(store, nodes=len(NODES), minutes=minutes, seed=7)
    tr.names = list(NODES)
    tr.t = tr.t - tr.t[-1] + time.time() - ago_s
    files: dict[Path, list[str]] = {}
    for rec in [*tr.records(), *tr.step_records()]:
        path = layout.node_telemetry_file(store, rec["node"], rec["ts"], 10)
        files.setdefault(path, []).append(schema.dumps(rec))
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")


def settings(store: Path) -> Settings:
    return build_settings(
        [Layer("test", {"store": {"root": str(store)}, "control": {"align": False}})]
    )


def ended(store: Path) -> list[str]:
    names = segments.group_files(source_files(store))
    now = time.time()
    return sorted(n for n in names if (segments.span(n) or (0, now))[1] + segments.GRACE_S <= now)


def test_the_leader_closes_ended_segments_after_its_pass(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shared_store.init(store)
    telemetry(store)
    before = read_frame(store, closed_segments=False)
    lines: list[str] = []
    c = Controller(settings(store), act=False, slurm=MemorySlurm(NODES), progress=lines.append)
    report = c.run_pass()
    assert report.leader
    done = ended(store)
    assert len(done) >= 2, done  # 25 minutes ending now: at least two 10-minute segments ended
    closed_now = sorted(p.stem for p in layout.manifests_dir(store).iterdir())
    assert closed_now == done
    assert any(line.startswith("control: closed segments ") for line in lines), lines
    after = read_frame(store)
    for kind in schema.KINDS:
        assert after.count(kind) == before.count(kind), kind
    m = closed.read_manifest(store, done[0])
    assert m is not None and set(m.kinds) <= set(schema.KINDS) and m.lines > 0


def test_a_controller_that_does_not_lead_closes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shared_store.init(store)
    telemetry(store)
    leader = Controller(settings(store), act=False, slurm=MemorySlurm(NODES))
    leader.lead()  # holds the lease
    other: Any = Controller(settings(store), act=False, slurm=MemorySlurm(NODES))
    assert not other.run_pass().leader
    assert not layout.manifests_dir(store).exists()


def test_a_store_closing_cannot_write_is_said_and_the_pass_stands(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shared_store.init(store)
    telemetry(store)
    (store / "segments").rmdir()
    (store / "segments").write_text("a file where the directory should be")
    lines: list[str] = []
    c = Controller(settings(store), act=False, slurm=MemorySlurm(NODES), progress=lines.append)
    assert c.run_pass().leader
    (said,) = [line for line in lines if line.startswith("control: closing segments: ")]
    assert "\n" not in said


def count_listings(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every directory listing from now on (the store's walks and the analyzer's listing both
    list through ``load._list_dir``), by directory."""
    listed: Counter[str] = Counter()
    load = sys.modules["guardctl.analyze.load"]  # (the package's ``load`` is a function)
    real = load._list_dir

    def counted(directory: str) -> tuple[list[str], list[str]] | None:
        listed[directory] += 1
        return real(directory)

    monkeypatch.setattr(load, "_list_dir", counted)
    return listed


def closed_by(lines: list[str]) -> list[str]:
    """The segments the passes said they closed, from the controller's lines, in time order."""
    said = [line for line in lines if line.startswith("control: closed segments ")]
    return sorted(name.strip(",") for line in said for name in line.split(" (")[0].split()[3:])


def test_the_leaders_closing_lists_no_directory_its_pass_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    shared_store.init(store)
    telemetry(store)
    lines: list[str] = []
    c = Controller(settings(store), act=False, slurm=MemorySlurm(NODES), progress=lines.append)
    for n in range(2):  # the first pass lists every directory; the next, those that changed
        listed = count_listings(monkeypatch)
        assert c.run_pass().leader
        if n == 0:
            written = {os.fspath(p.parent) for p in (store / "telemetry").glob("*/*.jsonl")}
            assert written and written <= set(listed)
        twice = {d: n for d, n in listed.items() if n > 1}
        assert not twice, twice
    assert closed_by(lines) == ended(store)  # and the closing still happened, from that listing


class LaterClock(Clock):
    """This host's clocks, the wall clock *ahead_s* ahead: passes made later."""

    ahead_s = 0.0

    def wall(self) -> float:
        return super().wall() + self.ahead_s


def test_the_leader_closes_what_lands_between_passes(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shared_store.init(store)
    telemetry(store)
    telemetry(store, ago_s=86400.0, minutes=10)  # a day the controller was down: never closed
    lines: list[str] = []
    clock = LaterClock()
    c = Controller(
        settings(store), act=False, slurm=MemorySlurm(NODES), progress=lines.append, clock=clock
    )
    assert c.run_pass().leader
    first = closed_by(lines)
    settled = time.time() - segments.LATE_S
    day_old = [n for n in first if (segments.span(n) or (0.0, 0.0))[1] < settled]
    assert day_old, first  # closed though long settled: it had no manifest
    assert first == ended(store)
    # An agent's backlog lands: a segment never seen (an hour ago) and bytes in a closed one.
    telemetry(store, ago_s=3600.0, minutes=10)
    grown = first[-1]
    node_file = store / "telemetry" / grown / f"{NODES[0]}.jsonl"
    last = node_file.read_text().splitlines()[-1]
    with node_file.open("a") as out:
        out.write(last + "\n")
    del lines[:]
    assert c.run_pass().leader
    new = sorted(set(ended(store)) - set(first))
    assert new and closed_by(lines) == new, (new, lines)  # the grown one is not due yet
    # Looked at again once a sixth of its age has passed since the last look (its bytes are
    # read from its files meanwhile).
    ended_at = (segments.span(grown) or (0.0, 0.0))[1]
    clock.ahead_s = (time.time() - ended_at) / 5 + 60.0
    del lines[:]
    assert c.run_pass().leader
    assert grown in closed_by(lines), lines  # (and the open one, if the later clock ended it)
    manifest = closed.read_manifest(store, grown)
    key = closed.relative(store, os.fspath(node_file))
    assert manifest is not None and manifest.files[key][1] == node_file.stat().st_size


class ElsewhereSource(StoreSource):
    """A source that is not the store's incremental analyzer (as Prometheus): each pass
    analyses afresh, leaving the controller's analyzer idle."""

    kind = "mixed"

    def newest(self, analyzer: Analyzer) -> Analysis:
        return self.analyze()


def test_with_another_source_the_leader_still_finds_new_segments(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shared_store.init(store)
    telemetry(store)
    lines: list[str] = []
    c = Controller(settings(store), act=False, slurm=MemorySlurm(NODES), progress=lines.append)
    c.source = ElsewhereSource(c.settings)
    assert c.run_pass().leader
    first = closed_by(lines)
    assert first == ended(store)
    telemetry(store, ago_s=3600.0, minutes=10)
    assert c.run_pass().leader
    assert closed_by(lines) == ended(store) and len(ended(store)) > len(first)
