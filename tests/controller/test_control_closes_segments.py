"""The controller's leader closes the store's ended segments after its pass; nobody else does.

Real controller over the in-memory Slurm, real store files: a job's telemetry ending now in
10-minute segments, so that the segments before the newest have ended.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from controltools import Trace

from guardctl.analyze.load import read_frame, source_files
from guardctl.config import Layer, Settings, build_settings
from guardctl.controller.loop import Controller
from guardctl.slurm.memory import MemorySlurm
from guardctl.storage import closed, layout, segments
from guardctl.storage import store as shared_store
from guardctl.storage.compact import GRACE_S
from guardctl.telemetry import schema

NODES = [f"node{i}" for i in range(1, 5)]


def telemetry(store: Path) -> None:
    """A job on four nodes whose telemetry ends now, in 10-minute segments."""
    tr = Trace(store, nodes=len(NODES), minutes=25, seed=7)
    tr.names = list(NODES)
    tr.t = tr.t - tr.t[-1] + time.time()
    files: dict[Path, list[str]] = {}
    for rec in [*tr.records(), *tr.step_records()]:
        name = segments.segment_name(rec["ts"], 10)
        path = store / "telemetry" / rec["node"] / f"{name}.jsonl"
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
    return sorted(n for n in names if (segments.span(n) or (0, now))[1] + GRACE_S <= now)


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
