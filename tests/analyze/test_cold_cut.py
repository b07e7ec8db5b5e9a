"""A cold pass lets go, as it reads, of the records older than its windows need.

A store running for an hour: the pass reads the segments that can hold the half hour and
more of step records it needs, and of the GPU, NIC and host records in them keeps only the
quarter of an hour its windows judge. Its analysis must be the one it makes from every
record of those segments, read from the files, from closed segments (manifests naming each
node's newest record, and manifests from before, which do not), and where most nodes'
records stop long before the newest segment (its windows then end earlier, and records let
go would have been needed: it reads them again).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from guardctl.analyze import engine
from guardctl.analyze.frame import cut
from guardctl.analyze.load import read_frame
from guardctl.config import Settings, load_settings
from guardctl.simulate import simulate
from guardctl.storage import layout
from guardctl.storage.compact import compact

START = 1_764_547_200.0  # 2025-12-01T00:00Z
HOUR = 3600.0
UNTIL = START + 2 * HOUR  # the pass's "now plus the tolerance": after every record


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fleet")
    simulate(out, nodes=24, duration=HOUR, seed=5, start=START, segment_minutes=10, handoff=True)
    return out


@pytest.fixture
def settings() -> Settings:
    return load_settings(environ={})


def _every_record(root: Path, settings: Settings) -> dict[str, object]:
    """The analysis of every record of the segments the cold pass reads, none let go."""
    cfg = settings.analyze
    frame = engine.load_recent(root, settings, engine.steps_needed(cfg), UNTIL)
    assert frame.let_go == 0
    return engine.analyze_frame(frame, cfg, until=UNTIL).to_dict()


def _cut_pass(root: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A cold pass that must not read again what it let go (the windows end in the newest
    segment, as they do in a store being written)."""
    with monkeypatch.context() as patch:
        patch.setattr(engine, "load_recent", pytest.fail)
        return engine.analyze(root, settings, until=UNTIL).to_dict()


def _let_go(root: Path, settings: Settings) -> int:
    frame, _ = engine._read_recent(
        root, settings, engine.steps_needed(settings.analyze), UNTIL, settings.analyze.window_s
    )
    return frame.let_go


def test_a_cold_pass_equals_one_over_every_record_it_read(
    fleet: Path, tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = shutil.copytree(fleet, tmp_path / "store")
    whole = _every_record(root, settings)
    assert _cut_pass(root, settings, monkeypatch) == whole
    assert any(v["verdict"] == "suspect" for v in whole["nodes"]), "a fault to agree on"  # type: ignore[attr-defined]
    read = whole["input"]["records"]  # type: ignore[index]
    assert 0.3 * read < _let_go(root, settings) < read  # most GPU, NIC and host records go


def test_closed_segments_let_go_of_old_records_unread(
    fleet: Path, tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = shutil.copytree(fleet, tmp_path / "store")
    whole = _every_record(root, settings)
    compact(root, START + HOUR + 20 * 60)  # every segment but the newest closed
    for path in root.rglob("*.cols"):
        path.unlink()  # the closed segments hold the records fast now
    assert _cut_pass(root, settings, monkeypatch) == whole
    assert _let_go(root, settings) > 0
    manifests = list(layout.manifests_dir(root).glob("*.json"))
    assert manifests
    for path in manifests:  # as written before manifests named each node's newest record
        body = json.loads(path.read_text())
        assert body.pop("newest")
        path.write_text(json.dumps(body))
    assert _cut_pass(root, settings, monkeypatch) == whole


def test_when_most_nodes_stopped_long_before_the_pass_reads_what_it_let_go(
    fleet: Path, tmp_path: Path, settings: Settings
) -> None:
    root = shutil.copytree(fleet, tmp_path / "store")
    # 13 of 24 nodes' records end here: in the oldest segment the pass reads, none of whose
    # records it needs if its windows end where the other nodes' records do
    stop = START + 12 * 60
    stopped = sorted(p.stem for p in (root / "telemetry").glob("*/*.jsonl"))
    stopped = sorted(set(stopped))[:13]
    for path in (root / "telemetry").glob("*/*.jsonl"):
        if path.stem in stopped:
            lines = [x for x in path.read_bytes().splitlines() if json.loads(x)["ts"] < stop]
            path.with_name(path.stem + ".cols").unlink(missing_ok=True)
            if lines:
                path.write_bytes(b"\n".join(lines) + b"\n")
            else:
                path.unlink()
    whole = _every_record(root, settings)
    # the windows end where most nodes' records do, long before the newest segment begins
    assert whole["window"]["end"] < stop + 60  # type: ignore[index]
    assert engine.analyze(root, settings, until=UNTIL).to_dict() == whole


def test_cut_counts_what_it_lets_go_and_each_nodes_newest(fleet: Path) -> None:
    frame = read_frame(fleet)
    records = frame.records
    newest = {kind: float(cols["ts"].max()) for kind, cols in frame.cols.items() if cols["ts"].size}
    since = {"gpu": newest["gpu"] + 1, "step": -float("inf")}  # every GPU record goes, no step
    cut(frame, since)
    assert frame.count("gpu") == 0
    assert frame.let_go + frame.records == records
    assert frame.let_go_newest is not None
    assert float(frame.let_go_newest.max()) == newest["gpu"]
