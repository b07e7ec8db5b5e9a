"""Closed segments: compaction into hive-partitioned Parquet, and reading through them.

Real files throughout: a simulated fleet written by the same writers the agent and the
probe use (JSON Lines plus column mirrors), compacted, then read back by the analyzer and
by pyarrow's own dataset reader, as a site's engine would.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from guardctl.analyze import analyze
from guardctl.analyze.frame import Builder, concat, parse_lines
from guardctl.analyze.load import read_frame, source_files
from guardctl.analyze.mirrors import records
from guardctl.config import load_settings
from guardctl.simulate import simulate
from guardctl.storage import closed, layout, segments
from guardctl.storage.compact import compact
from guardctl.telemetry import schema

START = 1_764_547_200.0  # 2025-12-01T00:00Z
LATER = START + 86400.0  # long after every segment ended
SOON = START + 3600.0  # the controller's clock, its analyzer's passes an hour into the fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fleet")
    simulate(out, nodes=32, duration=1500.0, seed=3, start=START, segment_minutes=10)
    return out


def _copy(src: Path, dst: Path) -> Path:
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    return dst


def _append_late_record(root: Path, segment: str = "*") -> Path:
    """Append a host record to the store's first node file (of *segment*), inside its segment
    (as an agent writing its backlog after an outage would); that file."""
    node_file = sorted((root / "telemetry").glob(f"{segment}/*.jsonl"))[0]
    ts = segments.file_span(node_file)[0] + 5.0  # type: ignore[index]
    late = {"v": 1, "kind": "host", "ts": ts, "node": node_file.stem, "cpu_pct": 1.5}
    with open(node_file, "ab") as fh:
        fh.write(json.dumps(late).encode() + b"\n")
    return node_file


def _same_records(a: object, b: object) -> None:
    ra, rb = records(a), records(b)  # type: ignore[arg-type]
    for kind in schema.KINDS:
        assert sorted(map(repr, ra[kind])) == sorted(map(repr, rb[kind])), kind


def test_round_trip_keeps_absent_values_and_every_kind() -> None:
    lines = [
        b'{"v":1,"kind":"gpu","ts":10.5,"node":"n1","gpu":0,"sm_clock_mhz":1980,"xid":null}',
        b'{"v":1,"kind":"gpu","ts":11,"node":"n2","gpu":1,"power_w":600.5,"xid":79,"job":"7"}',
        b'{"v":1,"kind":"nic","ts":12,"node":"n1","device":"mlx5_0","port":1,"state":"ACTIVE",'
        b'"xmit_wait":5}',
        b'{"v":1,"kind":"step","ts":13,"node":"n2","job":"7","rank":3,"step":9,"step_s":1.25}',
        b'{"v":1,"kind":"host","ts":14,"node":"n3","cpu_pct":12.5}',
    ]
    frame = parse_lines(lines)
    back = [closed.frame_of(k, closed.table_of(frame, k)) for k in schema.KINDS]
    _same_records(frame, concat(back))
    table = closed.table_of(frame, "gpu")
    assert table.column("power_w").null_count == 1  # absent: null, not NaN
    assert table.column("job").to_pylist() == [None, "7"]


def test_compacted_store_reads_as_its_json_lines(fleet: Path, tmp_path: Path) -> None:
    root = _copy(fleet, tmp_path / "store")
    raw = read_frame(root, closed_segments=False)
    report = compact(root, LATER)
    names = sorted(segments.group_files(source_files(root)))
    # 25 minutes in 10-minute segments, and a clock behind that wrote into 23:50
    assert report.closed == names and len(names) == 4
    back = read_frame(root)
    _same_records(raw, back)
    assert (back.files, back.lines, back.bad) == (raw.files, raw.lines, raw.bad)
    again = compact(root, LATER)
    assert again.closed == [] and again.current == 4


def test_verdicts_from_closed_segments_equal_those_from_the_files(
    fleet: Path, tmp_path: Path
) -> None:
    root = _copy(fleet, tmp_path / "store")
    settings = load_settings(environ={})
    at = START + 1440.0
    before = analyze(root, settings, at).to_dict()
    compact(root, LATER)
    for path in root.rglob("*.cols"):
        path.unlink()  # nothing but the closed segments holds the records fast now
    after = analyze(root, settings, at).to_dict()
    assert after == before
    assert any(v["verdict"] == "suspect" for v in before["nodes"]), "a fault to agree on"


def test_an_open_segment_is_left_alone(fleet: Path, tmp_path: Path) -> None:
    root = _copy(fleet, tmp_path / "store")
    last_end = START + 1800.0  # the third segment ends at 00:30
    report = compact(root, last_end + 60.0)  # within the grace
    assert len(report.closed) == 3 and report.open == 1
    _same_records(read_frame(root, closed_segments=False), read_frame(root))


def test_bytes_appended_after_closing_are_read_once(fleet: Path, tmp_path: Path) -> None:
    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    node_file = _append_late_record(root)
    raw = read_frame(root, closed_segments=False)
    _same_records(raw, read_frame(root))
    report = compact(root, LATER)
    assert report.closed == [segments.segment_of(node_file)]  # it grew: written again
    _same_records(raw, read_frame(root))


def test_segments_read_into_one_frame_hold_what_each_read_and_joined_holds(
    fleet: Path, tmp_path: Path
) -> None:
    """Closed segments written straight into one frame (no rows given at the start: every
    column made longer as segments come) hold what each read alone and joined holds; a
    segment that cannot be read whole leaves no record and no name behind."""
    root = _copy(fleet, tmp_path / "store")
    names = sorted(segments.group_files(source_files(root)))
    node_file = sorted((root / "telemetry" / names[2]).glob("*.jsonl"))[0]
    ts = segments.file_span(node_file)[0] + 5.0  # type: ignore[index]
    stray = {"v": 1, "kind": "gpu", "ts": ts, "node": "stray", "gpu": 0, "job": "stray-job"}
    with open(node_file, "ab") as fh:
        fh.write(json.dumps(stray).encode() + b"\n")
    compact(root, LATER)
    manifests = [closed.read_manifest(root, name) for name in names[:3]]
    assert all(m is not None for m in manifests)
    keep = dict.fromkeys(schema.KINDS, START + 300.0)  # half of the second segment kept
    builder = Builder({}, threads=2)
    for manifest in manifests[:2]:
        assert manifest is not None and closed.read_whole(builder, root, manifest, keep)
    broken = manifests[2]
    assert broken is not None and list(broken.kinds)[-1] == "step"  # read after the GPUs'
    layout.parquet_path(root, "step", broken.segment, broken.start).unlink()
    before = builder.mark()
    assert not closed.read_whole(builder, root, broken, keep)
    assert builder.mark() == before
    one = builder.frame()
    joined = concat([closed.read(root, m, keep_from=keep) for m in manifests[:2] if m])
    _same_records(one, joined)
    assert "stray" not in one.nodes and "stray-job" not in one.jobs
    assert (one.nodes, one.jobs, one.ports) == (joined.nodes, joined.jobs, joined.ports)
    assert (one.let_go, one.lines, one.files, one.bad) == (
        joined.let_go,
        joined.lines,
        joined.files,
        joined.bad,
    )
    assert one.let_go > 0 and one.count("gpu") > 0 and one.count("step") > 0
    assert one.let_go_newest is not None
    np.testing.assert_array_equal(one.let_go_newest, joined.let_go_newest)


def test_a_row_group_is_filtered_only_where_its_times_straddle_a_bound(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read with a time bound, a closed segment's row groups wholly inside it are taken as
    they are (a filter copies every column) and those across it filtered: what is read is
    every record of the segment stamped within the bounds, no more, no less."""
    root = _copy(fleet, tmp_path / "store")
    monkeypatch.setattr(closed, "ROW_GROUP", 500)  # several row groups per kind's file
    compact(root, LATER)
    manifest = closed.read_manifest(root, sorted(segments.group_files(source_files(root)))[1])
    assert manifest is not None
    whole = closed.read(root, manifest)
    filters = []
    within = closed._within
    monkeypatch.setattr(
        closed, "_within", lambda *bounds: filters.append(bounds) or within(*bounds)
    )
    before = dict.fromkeys(schema.KINDS, manifest.start - 1.0)
    _same_records(closed.read(root, manifest, keep_from=before), whole)
    assert filters == []
    low, high = manifest.start + 200.0, manifest.start + 400.0
    got = closed.read(root, manifest, since=low, until=high)
    want = Builder(manifest.kinds)
    for kind in schema.KINDS:
        ts = whole.cols[kind]["ts"]
        want.add(
            closed.frame_of(kind, closed.table_of(whole, kind).filter((ts >= low) & (ts <= high)))
        )
    _same_records(got, want.frame())
    assert 0 < got.count("gpu") < whole.count("gpu")
    groups = sum(
        pq.ParquetFile(
            layout.parquet_path(root, kind, manifest.segment, manifest.start)
        ).num_row_groups
        for kind, rows in manifest.kinds.items()
        if rows
    )
    assert 0 < len(filters) <= groups  # (rows in node order: most groups span the segment)


def _closed_node_file(fleet: Path, tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A closed copy of *fleet*, one of its node files and that file's bytes."""
    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    node_file = sorted((root / "telemetry").glob("*/*.jsonl"))[0]
    return root, node_file, node_file.read_bytes()


def test_a_file_cut_shorter_than_its_segment_is_read_from_the_file(
    fleet: Path, tmp_path: Path
) -> None:
    root, node_file, data = _closed_node_file(fleet, tmp_path)
    node_file.write_bytes(data[: data.index(b"\n") + 1])  # an operator cut it down
    _same_records(read_frame(root, closed_segments=False), read_frame(root))


def test_a_file_replaced_whole_is_read_from_the_file_and_closed_again(
    fleet: Path, tmp_path: Path
) -> None:
    root, node_file, data = _closed_node_file(fleet, tmp_path)
    first = data[: data.index(b"\n") + 1]
    replaced = node_file.with_name(".replacing")
    # Another file (a new inode), at least as long, of other records: its first one repeated.
    replaced.write_bytes(first * (len(data) // len(first) + 1))
    os.replace(replaced, node_file)
    _same_records(read_frame(root, closed_segments=False), read_frame(root))
    assert compact(root, LATER).closed == [segments.segment_of(node_file)]
    _same_records(read_frame(root, closed_segments=False), read_frame(root))
    assert not compact(root, LATER).closed  # now made from the file as it is


def test_a_partial_last_line_is_counted_once_and_never_closed_in(
    fleet: Path, tmp_path: Path
) -> None:
    root = _copy(fleet, tmp_path / "store")
    node_file = sorted((root / "telemetry").glob("*/*.jsonl"))[0]
    with open(node_file, "ab") as fh:
        fh.write(b'{"v":1,"kind":"host","ts":')  # an agent killed mid-write
    raw = read_frame(root, closed_segments=False)
    compact(root, LATER)
    back = read_frame(root)
    assert back.bad["truncated"] == raw.bad["truncated"] == 1
    _same_records(raw, back)


def test_a_foreign_reader_prunes_by_kind_and_hour(fleet: Path, tmp_path: Path) -> None:
    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    dataset = ds.dataset(root / "segments" / "kind=gpu", format="parquet", partitioning="hive")
    table = dataset.to_table(filter=(ds.field("hour") == 0))
    raw = read_frame(root, closed_segments=False)
    in_hour = [
        m
        for m in map(
            lambda n: closed.read_manifest(root, n), segments.group_files(source_files(root))
        )
        if m is not None and START <= m.start < START + 3600
    ]
    assert table.num_rows == sum(m.kinds["gpu"] for m in in_hour) > 0
    assert set(table.column("node").to_pylist()) == set(raw.nodes)
    assert table.column("date").unique().to_pylist() == ["2025-12-01"]
    assert Counter(p.name for p in (root / "segments").iterdir()) == Counter(
        ["_manifests", *(f"kind={k}" for k in ("gpu", "host", "nic", "step"))]
    )
    stamp = os.path.basename(next((root / "segments/kind=gpu").iterdir()))
    assert stamp == "date=2025-12-01"


def test_a_damaged_closed_segment_is_never_fatal(fleet: Path, tmp_path: Path) -> None:
    root = _copy(fleet, tmp_path / "store")
    settings = load_settings(environ={})
    at = START + 1440.0
    good = analyze(root, settings, at).to_dict()
    compact(root, LATER)
    parquet = sorted((root / "segments").rglob("*.parquet"))
    parquet[0].write_bytes(parquet[0].read_bytes()[:-100])  # cut short
    manifest = sorted((root / "segments" / "_manifests").iterdir())[-1]
    manifest.write_text("{oops")
    parquet[-1].unlink()  # half removed
    assert analyze(root, settings, at).to_dict() == good


def test_retention_removes_closed_segments_with_their_files(fleet: Path, tmp_path: Path) -> None:
    from guardctl.storage import store as shared_store

    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    names = sorted(segments.group_files(source_files(root)))
    cutoff_end = segments.span(names[1])[1]  # type: ignore[index]
    report = shared_store.prune(root, 0.0, now=cutoff_end)  # the first two segments ended
    gone = {Path(f).stem for f in report.files if f.endswith((".parquet", ".json"))}
    assert gone == set(names[:2])
    kept = sorted(p.stem for p in layout.manifests_dir(root).iterdir())
    assert kept == names[2:]
    assert not any((root / "segments").rglob("*T2350_10m*"))
    assert not list((root / "segments").glob("kind=*/date=2025-11-30"))  # emptied: removed
    _same_records(read_frame(root, closed_segments=False), read_frame(root))


def test_a_budget_leaves_the_rest_for_the_next_call(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from guardctl.storage import compact as compacting

    root = _copy(fleet, tmp_path / "store")
    monkeypatch.setattr(compacting, "FILES_AT_ONCE", 7)  # each segment in several parts
    first = compact(root, LATER, budget_s=0.0)  # out of time before the first: none begun
    assert first.closed == [] and first.deferred == 4
    done = compact(root, LATER)
    assert len(done.closed) == 4
    _same_records(read_frame(root, closed_segments=False), read_frame(root))


def test_a_kind_from_another_compaction_is_not_trusted(fleet: Path, tmp_path: Path) -> None:
    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    name = sorted(segments.group_files(source_files(root)))[1]
    manifest = closed.read_manifest(root, name)
    assert manifest is not None
    step = layout.parquet_path(root, "step", name, manifest.start)
    older = step.read_bytes()
    node_file = sorted((root / "telemetry" / name).glob("*.jsonl"))[0]
    late = {
        "v": 1,
        "kind": "step",
        "ts": manifest.start + 5.0,
        "node": node_file.stem,
        "job": "late",
        "rank": 0,
        "step": 1,
        "step_s": 1.0,
    }
    with open(node_file, "ab") as fh:
        fh.write(json.dumps(late).encode() + b"\n")
    compact(root, LATER)  # the segment grew: written again, one more step row
    step.write_bytes(older)  # an earlier compaction's rename landing last
    _same_records(read_frame(root, closed_segments=False), read_frame(root))


def test_with_a_recheck_window_older_closed_segments_are_taken_as_they_are(
    fleet: Path, tmp_path: Path
) -> None:
    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    node_file = _append_late_record(root)
    # Every segment ended a day before: long past the window this caller looks at.
    quick = compact(root, LATER, rechecks=segments.Rechecks(3600.0))
    assert quick.closed == [] and quick.current == 4
    _same_records(read_frame(root, closed_segments=False), read_frame(root))  # still read
    assert compact(root, LATER).closed == [segments.segment_of(node_file)]


def test_a_closed_segment_is_looked_at_again_less_often_the_older_it_is() -> None:
    rechecks = segments.Rechecks(window_s=3 * 3600.0)
    assert rechecks.due("s", 0.0, 600.0)  # within the window, never looked at: looked at
    rechecks.saw("s", 0.0, 600.0)
    assert not rechecks.due("s", 0.0, 660.0)  # 11 minutes old: looked at again after 2
    assert rechecks.due("s", 0.0, 720.0)
    rechecks.saw("s", 0.0, 7200.0)  # two hours old: again after 24 minutes
    assert not rechecks.due("s", 0.0, 7200.0 + 1380.0)
    assert rechecks.due("s", 0.0, 7200.0 + 1440.0)
    rechecks.saw("s", 0.0, 10_000.0)
    assert rechecks.due("s", 0.0, 10_900.0)  # the window is over: one last look
    rechecks.saw("s", 0.0, 10_900.0)
    assert not rechecks.due("s", 0.0, 20_000.0)  # then never again
    rechecks.saw("v", 0.0, 600.0)  # one never looked at again (its files no longer listed)
    rechecks.forget_settled(20_000.0)
    assert "v" in rechecks.last_look and not rechecks.due("s", 0.0, 20_000.0)
    rechecks.forget_settled(2 * 3 * 3600.0)  # a window past the window: let go of
    assert rechecks.last_look == {}
    assert not segments.Rechecks().due("t", 0.0, 20_000.0)  # past it, never looked at: as it is
    # A leader passing a minute apart looks at a segment some 25 times in its 3 hours, not 178.
    looks = 0
    for now in range(120, 4 * 3600, 60):
        if rechecks.due("u", 0.0, now):
            rechecks.saw("u", 0.0, now)
            looks += 1
    assert 15 <= looks <= 30, looks
    assert max(when for _, when in rechecks.last_look.values()) >= 3 * 3600.0  # the last look


def test_bytes_a_closed_segment_gains_are_read_at_once_and_closed_in_when_it_is_due(
    fleet: Path, tmp_path: Path
) -> None:
    root = _copy(fleet, tmp_path / "store")
    name = sorted(segments.group_files(source_files(root)))[0]
    end = segments.span(name)[1]  # type: ignore[index]
    now = end + 3600.0
    rechecks = segments.Rechecks()
    first = compact(root, now, rechecks=rechecks)  # every ended segment closed and seen
    assert first.closed and not first.deferred
    _append_late_record(root, name)
    a_minute_later = compact(root, now + 60.0, rechecks=rechecks)
    assert a_minute_later.closed == [] and a_minute_later.looked == 0  # no segment due yet
    _same_records(read_frame(root, closed_segments=False), read_frame(root))  # read all the same
    # An hour old when last seen: due 12 minutes later (a sixth of its age by then).
    assert compact(root, now + 700.0, rechecks=rechecks).closed == []
    assert compact(root, now + 720.0, rechecks=rechecks).closed == [name]
    _same_records(read_frame(root, closed_segments=False), read_frame(root))
    # Bytes gained just before the window ends are closed in by the last look after it.
    settles = end + segments.LATE_S
    assert compact(root, settles - 30.0, rechecks=rechecks).closed == []
    _append_late_record(root, name)
    assert compact(root, settles + 60.0, rechecks=rechecks).closed == [name]
    _append_late_record(root, name)  # past the window and its last look: taken as it is
    assert compact(root, settles + 3600.0, rechecks=rechecks).closed == []
    _same_records(read_frame(root, closed_segments=False), read_frame(root))


def test_a_leader_taking_over_keeps_to_the_last_ones_looks(fleet: Path, tmp_path: Path) -> None:
    root = _copy(fleet, tmp_path / "store")
    first = sorted(segments.group_files(source_files(root)))[0]
    end = segments.span(first)[1]  # type: ignore[index]
    now = end + 3600.0
    assert compact(root, now).closed  # closed by the last leader
    manifests = sorted(layout.manifests_dir(root).iterdir())

    def looked_at(when: float, *paths: Path) -> None:
        for path in paths:
            os.utime(path, (when, when))

    looked_at(now - 60.0, *manifests)  # the last leader looked a minute ago
    assert compact(root, now, rechecks=segments.Rechecks()).looked == 0
    looked_at(end + 60.0, layout.manifest_path(root, first))  # 59 minutes ago: due
    assert compact(root, now, rechecks=segments.Rechecks()).looked == 1
    assert layout.manifest_path(root, first).stat().st_mtime == now  # this look, for the next
    assert compact(root, now + 60.0, rechecks=segments.Rechecks()).looked == 0
    looked_at(now + 600.0, *manifests)  # a clock ahead of this one's: each looked at
    ahead = compact(root, now, rechecks=segments.Rechecks())
    assert ahead.looked == len(manifests) - ahead.open
    last = max(segments.span(m.stem)[1] for m in manifests)  # type: ignore[index]
    looked_at(last + 60.0, *manifests)  # past every window: taken as it is, no last look
    assert compact(root, last + segments.LATE_S + 60.0, rechecks=segments.Rechecks()).looked == 0


def test_the_leaders_compaction_looks_at_no_file_of_a_settled_segment(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    groups = segments.group_files(source_files(root))  # as the leader's pass listed them
    unclosed = sorted(groups)[1]
    layout.manifest_path(root, unclosed).unlink()  # (retention, or a hand) removed it
    looked: list[str] = []
    real = os.stat

    def counted(path: object, *args: object, **kwargs: object) -> os.stat_result:
        looked.append(os.fspath(path))  # type: ignore[call-overload]
        return real(path, *args, **kwargs)  # type: ignore[call-overload,arg-type]

    monkeypatch.setattr(os, "stat", counted)
    report = compact(root, LATER, rechecks=segments.Rechecks(3600.0), groups=groups)
    monkeypatch.undo()
    assert report.closed == [unclosed] and report.current == 3
    store_files = [os.sep + top + os.sep for top in ("telemetry", "steps", "_manifests")]
    settled = [p for p in looked if any(part in p for part in store_files)]
    assert not [p for p in settled if unclosed not in p], settled  # only the one it closed
