"""A closed segment's column mirrors go: every reader reads it from its Parquet files.

Real files throughout (the fleet and helpers of test_closed_segments): once a closed segment
may no longer grow, ``guardctl store prune`` removes the mirror of each file the segment holds
to its end (closing it again, while it may grow, reads them); the cold reader, the
controller's incremental analyzer, the agent's writer appending late bytes and ``guardctl
store check`` each cope with a mirror that is gone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_closed_segments import (
    LATER,
    SOON,
    START,
    _append_late_record,
    _copy,
    _same_records,
    fleet,
)

from guardctl.analyze import analyze, mirrors
from guardctl.analyze.engine import needed_from
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.load import read_frame, source_files
from guardctl.config import load_settings
from guardctl.errors import StoreError
from guardctl.storage import closed, layout, segments, store
from guardctl.storage.compact import compact
from guardctl.storage.writer import LineWriter
from guardctl.telemetry.mirror import Mirror, mirror_path

# Long after the fleet's segments: none may grow any more (their mirrors may go) ...
SETTLED = LATER + segments.LATE_S
# ... and a raw retention that keeps their JSON Lines.
RAW_KEPT_S = 2 * 86400.0

__all__ = ["fleet"]  # the shared fixture, imported for pytest to find


def _store(fleet: Path, tmp_path: Path) -> Path:
    """A copy of *fleet* whose mirrors are usable: a mirror names its file's inode, so the
    copies' are rebuilt, by the writers' own code, as an agent started again rebuilds them."""
    root = _copy(fleet, tmp_path / "store")
    rebuild = Mirror()
    for name in source_files(root):
        rebuild.sync(name)
        rebuild.forget(name)
    return root


def _settle(root: Path, *, dry_run: bool = False) -> store.PruneReport:
    """Prune as the hourly cron job does once the fleet's segments may no longer grow."""
    return store.prune(
        root, 30 * 86400.0, raw_older_than_s=RAW_KEPT_S, now=SETTLED, dry_run=dry_run
    )


def _close(root: Path) -> None:
    """Close every segment, then prune once they may no longer grow: their mirrors go."""
    compact(root, LATER)
    _settle(root)


def _mirrors(root: Path) -> set[str]:
    return {os.fspath(p.relative_to(root)) for p in root.rglob("*.cols")}


def _late_line(node_file: Path, kind: str = "host") -> bytes:
    """A record inside *node_file*'s segment, as an agent writing its backlog would add."""
    ts = segments.file_span(node_file)[0] + 7.0  # type: ignore[index]
    record = {"v": 1, "kind": kind, "ts": ts, "node": node_file.parent.name, "cpu_pct": 2.5}
    return json.dumps(record).encode() + b"\n"


def test_pruning_removes_the_mirrors_of_settled_closed_segments_it_holds_whole(
    fleet: Path, tmp_path: Path
) -> None:
    root = _store(fleet, tmp_path)
    files = source_files(root)
    assert {mirrors.verify(name) for name in files} == {"whole"}
    unfinished = Path(files[0])
    with open(unfinished, "ab") as fh:
        fh.write(b'{"v":1,"kind":"host","ts":')  # an agent killed mid-write
    before = _mirrors(root)
    assert len(before) == len(files)
    node_dir = unfinished.parent
    entries = len(os.listdir(node_dir))
    compact(root, LATER)
    assert _mirrors(root) == before  # closing it again while it may grow reads them
    # Not before the segments may no longer grow, and never in a dry run.
    soon = segments.file_span(files[-1])[1] + 3600.0  # type: ignore[index]
    store.prune(root, 30 * 86400.0, raw_older_than_s=RAW_KEPT_S, now=soon)
    assert _mirrors(root) == before
    assert _settle(root, dry_run=True).raw_files and _mirrors(root) == before
    _settle(root)
    # Only the file whose last line was unfinished keeps its mirror: it is not done with.
    assert _mirrors(root) == {os.fspath(Path(mirror_path(unfinished)).relative_to(root))}
    assert len(os.listdir(node_dir)) == entries // 2 + 1
    raw = read_frame(root, closed_segments=False)  # every file parsed whole now
    _same_records(raw, read_frame(root))


def test_mirrors_stay_when_the_manifest_cannot_be_written(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _store(fleet, tmp_path)
    before = _mirrors(root)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(closed, "atomic_write", full)
    with pytest.raises(StoreError):
        compact(root, LATER)
    _settle(root)
    assert _mirrors(root) == before  # not closed: readers still read the files


def test_a_closed_segment_reads_as_its_files_with_its_mirrors_gone(
    fleet: Path, tmp_path: Path
) -> None:
    root = _store(fleet, tmp_path)
    raw = read_frame(root, closed_segments=False)  # through the mirrors
    _close(root)
    assert not _mirrors(root)
    _same_records(raw, read_frame(root))  # from the Parquet files
    grown = _append_late_record(root)  # read past what its segment holds, parsed
    raw = read_frame(root, closed_segments=False)
    _same_records(raw, read_frame(root))
    # Cut shorter than its segment: the segment no longer matches, its files are parsed whole.
    data = grown.read_bytes()
    grown.write_bytes(data[: data.index(b"\n") + 1])
    _same_records(read_frame(root, closed_segments=False), read_frame(root))


def test_the_agents_writer_rebuilds_a_removed_mirror_from_byte_0(
    fleet: Path, tmp_path: Path
) -> None:
    """An agent writing its backlog into a closed segment's file, whose mirror was removed:
    the mirror it writes covers the file from its first byte (a reader trusts only a chain
    of marks from byte 0), or none is left where it was removed under the writer."""
    root = _store(fleet, tmp_path)
    _close(root)
    node_file = Path(sorted(source_files(root))[0])
    writer = LineWriter(mirror=Mirror())
    writer.append(node_file, _late_line(node_file))
    assert os.path.exists(mirror_path(node_file))
    assert mirrors.verify(node_file) == "whole"  # holds what parsing the whole file gives
    # Closed again (it grew), then pruned while the writer still holds that mirror open.
    assert compact(root, LATER).closed == [segments.segment_of(node_file)]
    _settle(root)
    writer.append(node_file, _late_line(node_file, "host"))
    assert mirrors.verify(node_file) == "none"  # written where no reader looks
    writer.close()
    fresh = LineWriter(mirror=Mirror())  # an agent started again
    fresh.append(node_file, _late_line(node_file))
    fresh.close()
    assert mirrors.verify(node_file) == "whole"
    _same_records(read_frame(root, closed_segments=False, column_files=False), read_frame(root))


def test_store_check_counts_a_closed_segments_removed_mirror_as_closed(
    fleet: Path, tmp_path: Path
) -> None:
    root = _store(fleet, tmp_path)
    _close(root)
    bare = root / "telemetry" / "elsewhere" / "20251201T0000_10m.jsonl"  # never closed in
    bare.parent.mkdir()
    bare.write_bytes(_late_line(bare))
    report = store.check(root)
    assert report.mirrors == {"closed": len(source_files(root)) - 1, "none": 1}
    assert not report.bad_total and not report.mirror_differs


def test_the_incremental_analyzer_copes_with_mirrors_removed_under_it(
    fleet: Path, tmp_path: Path
) -> None:
    root = _store(fleet, tmp_path)
    settings = load_settings(environ={})
    inc = Analyzer(settings, root, clock=lambda: SOON)
    assert inc.analyze().to_dict() == analyze(root, settings).to_dict()  # from the mirrors
    assert inc.read["mirror_files"] > 0 and any(st.fd >= 0 for st in inc._files.values())
    _close(root)  # the mirrors it keeps open are removed
    files = sorted(source_files(root))
    agent = LineWriter(mirror=Mirror())  # late bytes: one writer rebuilds the mirror ...
    agent.append(Path(files[0]), _late_line(Path(files[0])))
    with open(files[1], "ab") as fh:  # ... another writes none
        fh.write(_late_line(Path(files[1])))
    assert inc.analyze().to_dict() == analyze(root, settings).to_dict()
    # The mirror it had open holds no late rows, and the other file has none: both parsed.
    assert inc.read["parsed_bytes"] == sum(len(_late_line(Path(f))) for f in files[:2])
    for _ in range(2):  # then read from the rebuilt mirror, or parsed for good
        assert inc.analyze().to_dict() == analyze(root, settings).to_dict()
    agent.close()
    inc.close()


def test_a_first_pass_reads_closed_segments_from_parquet_and_parses_only_late_bytes(
    fleet: Path, tmp_path: Path
) -> None:
    root = _store(fleet, tmp_path)
    settings = load_settings(environ={})
    _close(root)
    late = [Path(f) for f in sorted(source_files(root))[:2]]
    for path in late:
        with open(path, "ab") as fh:
            fh.write(_late_line(path))
    inc = Analyzer(settings, root, clock=lambda: SOON)
    assert inc.analyze().to_dict() == analyze(root, settings).to_dict()
    assert inc.read["parsed_bytes"] == sum(len(_late_line(p)) for p in late)
    assert inc.analyze().to_dict() == analyze(root, settings).to_dict()
    assert inc.read["parsed_bytes"] == 0 and inc.restarts == 0
    inc.close()


def test_a_first_pass_reads_of_closed_segments_the_records_its_windows_need(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _store(fleet, tmp_path)
    settings = load_settings(environ={})
    _close(root)
    read = []  # per closed segment read: each kind's record times, and the records let go
    read_held = closed.read_held

    def spy(*args: object, **kwargs: object) -> object:
        found = read_held(*args, **kwargs)  # type: ignore[arg-type]
        frame = found[0]  # type: ignore[index]
        read.append(({k: c["ts"].copy() for k, c in frame.cols.items()}, frame.let_go))
        return found

    monkeypatch.setattr(closed, "read_held", spy)
    inc = Analyzer(settings, root, clock=lambda: SOON)
    # counted whole, each node's newest among the records let go kept: as a cold pass
    assert inc.analyze().to_dict() == analyze(root, settings).to_dict()
    # The windows end no earlier than the newest segment begins: of the older segments, the
    # judged windows' kinds are read from where those windows would begin (the steps whole:
    # the ranks' own history reaches back before the fleet began).
    names = layout.closed_segments(root)
    newest = max(segments.span(name)[0] for name in names)  # type: ignore[index]
    needed = needed_from(newest, settings.analyze)
    assert len(read) == len(names) and sum(let_go for _, let_go in read) > 0
    for times, _ in read:
        for kind, ts in times.items():
            assert not (ts < needed[kind]).any(), kind
    manifests = [closed.read_manifest(root, name) for name in names]
    assert sum(sum(map(len, times.values())) + let_go for times, let_go in read) == sum(
        sum(m.kinds.values()) for m in manifests if m is not None
    )
    assert inc.analyze().to_dict() == analyze(root, settings).to_dict()
    assert inc.restarts == 0 and inc.cold_passes == 0
    inc.close()


def test_a_first_pass_whose_windows_end_before_the_newest_segment_runs_cold(
    fleet: Path, tmp_path: Path
) -> None:
    root = _store(fleet, tmp_path)
    settings = load_settings(environ={})
    _close(root)
    # One node's clock runs ahead: its record lies in a segment of its own, newer than the
    # others' and past where the windows end (beyond the median node's newest by more than
    # a window): the first pass read its closed segments for windows ending there.
    node = sorted((root / "telemetry").glob("*/*.jsonl"))[0].stem  # (an agent's file)
    ahead = START + 1850.0
    segment = root / "telemetry" / segments.segment_name(ahead, 10)
    segment.mkdir()
    record = {"v": 1, "kind": "host", "ts": ahead, "node": node, "cpu_pct": 3.0}
    (segment / f"{node}.jsonl").write_bytes(json.dumps(record).encode() + b"\n")
    inc = Analyzer(settings, root, grid_s=60.0, clock=lambda: SOON)
    got = inc.analyze().to_dict()
    end = got["window"]["end"]
    assert end < START + 1800.0 and inc.cold_passes == 1
    assert got == analyze(root, settings, end).to_dict()
    inc.close()
