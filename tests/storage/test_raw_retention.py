"""Raw retention: the JSON Lines of closed segments go after a day, and readers read Parquet.

Real files throughout: the simulated fleet of test_closed_segments.py, closed into Parquet,
then pruned with a raw retention; what is deleted, what is kept and why, and that every
reader (read_frame, a pass at a time, the newest records of an idle store, the controller's
analyzer going cold) finds the same records and verdicts as before.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
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

from guardctl.analyze import analyze, engine, incremental
from guardctl.analyze.frame import Frame
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.load import read_frame, source_files
from guardctl.config import Layer, build_settings, load_settings
from guardctl.errors import ConfigError
from guardctl.sections.store import StoreSettings
from guardctl.simulate import simulate
from guardctl.storage import closed, layout, segments, store
from guardctl.storage.compact import compact

__all__ = ["fleet"]  # the shared fixture, imported for pytest to find

# (the package's name `load` is the function that reads a store)
loading = importlib.import_module("guardctl.analyze.load")
KEEP_ALL = 1000 * 86400.0  # a retention that deletes none of the fleet's files
DAY = 86400.0


def _names(root: Path) -> list[str]:
    return sorted(segments.group_files(source_files(root)))


def _files_of(root: Path, name: str) -> list[Path]:
    """A segment's JSON Lines files and column mirrors, telemetry and steps."""
    tops = layout.telemetry_inputs(root)
    return sorted(
        p for top in tops for p in top.rglob("*") if p.is_file() and segments.segment_of(p) == name
    )


def _closed_store(fleet: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    root = _copy(fleet, tmp_path / "store")
    compact(root, LATER)
    return root, _names(root)


def _cut_short(path: Path) -> None:
    with open(path, "ab") as fh:
        fh.write(b'{"v":1,"kind":"host","ts":')  # an agent killed mid-write


def _prune_raw(root: Path, now: float, dry_run: bool = False) -> store.PruneReport:
    return store.prune(root, KEEP_ALL, raw_older_than_s=DAY, now=now, dry_run=dry_run)


def test_prune_lets_go_only_of_json_lines_their_closed_segment_holds_whole(
    fleet: Path, tmp_path: Path
) -> None:
    root = _copy(fleet, tmp_path / "store")
    names = _names(root)  # 23:50, 00:00, 00:10, 00:20
    assert len(names) == 4
    unfinished = sorted((root / "telemetry" / names[0]).glob("*.jsonl"))[1]
    _cut_short(unfinished)  # its last line is not in the closed segment
    compact(root, LATER)
    grown = _append_late_record(root, names[0])  # an agent's backlog, into 23:50
    assert segments.segment_of(grown) == names[0]
    compact(root, LATER)  # 23:50 written again with the late record: whole again
    layout.manifest_path(root, names[1]).unlink()  # 00:00: not closed (any more)
    _append_late_record(root, names[2])  # 00:10 grew since it was closed
    before = read_frame(root, closed_segments=False)
    by_name = {name: _files_of(root, name) for name in names}
    now = segments.span(names[2])[1] + DAY  # type: ignore[index]  # 00:10 ended a day ago

    dry = _prune_raw(root, now, dry_run=True)
    assert all(p.exists() for files in by_name.values() for p in files)  # nothing deleted
    done = _prune_raw(root, now)
    assert done.raw_files == dry.raw_files and done.raw_bytes == dry.raw_bytes > 0
    assert done.files == [] and done.raw_cutoff == now - DAY

    gone = {p for files in by_name.values() for p in files if not p.exists()}
    # the closed, whole segment: every file and mirror but the one whose last line was cut;
    # of 00:20, closed and whole, past growing but within the raw retention: the mirrors
    cut = unfinished.with_suffix("")
    mirrors_only = {p for p in by_name[names[3]] if p.suffix == ".cols"}
    assert gone - mirrors_only == {p for p in by_name[names[0]] if p.with_suffix("") != cut}
    assert gone & mirrors_only == mirrors_only != set()
    assert {Path(f) for f in done.raw_files} == gone
    for mirror in (p for p in gone - mirrors_only if p.suffix == ".cols"):  # before its file
        assert done.raw_files.index(str(mirror)) < done.raw_files.index(
            str(mirror.with_suffix(".jsonl"))
        )
    assert done.raw_kept == {
        store.UNFINISHED: 1,
        store.NOT_CLOSED: len([p for p in by_name[names[1]] if p.suffix == ".jsonl"]),
        store.CHANGED: len([p for p in by_name[names[2]] if p.suffix == ".jsonl"]),
    }  # and 00:20's JSON Lines, within the raw retention, stay (not counted)
    assert all(p.exists() for p in by_name[names[3]] if p.suffix == ".jsonl")
    assert len(list(layout.manifests_dir(root).iterdir())) == 3  # Parquet stays: retention's
    after = read_frame(root)
    _same_records(before, after)
    assert (after.files, after.lines, after.bad) == (before.files, before.lines, before.bad)
    assert after.bad["truncated"] == 1  # the cut line, counted as before


def _first_outlived(fleet: Path, tmp_path: Path) -> tuple[Path, str, Frame]:
    """A closed store whose first segment's JSON Lines raw retention removed (a day after it
    ended); that segment, and the store's records before."""
    root, names = _closed_store(fleet, tmp_path)
    whole = read_frame(root)
    _prune_raw(root, segments.span(names[0])[1] + DAY)  # type: ignore[index]
    return root, names[0], whole


def test_a_segment_that_outlived_its_files_is_never_written_again_from_the_rest(
    fleet: Path, tmp_path: Path
) -> None:
    root, first, whole = _first_outlived(fleet, tmp_path)
    assert not _files_of(root, first)
    late = root / "telemetry" / first / "node-late.jsonl"  # a backlog, days late
    late.parent.mkdir()  # (its segment's directory went with its last file)
    record = {"v": 1, "kind": "host", "ts": START - 300.0, "node": "node-late", "cpu_pct": 3.0}
    late.write_text(json.dumps(record) + "\n")
    assert compact(root, LATER).closed == []  # rewriting it from one file would lose the rest
    back = read_frame(root)
    assert back.count("host") == whole.count("host") + 1 and back.files == whole.files + 1
    again = _prune_raw(root, LATER + DAY)  # a file the closed segment was not made from
    assert late.exists() and again.raw_kept[store.CHANGED] == 1
    _same_records(back, read_frame(root))


def test_a_file_made_again_by_a_name_the_segment_outlived_is_read_beside_it(
    fleet: Path, tmp_path: Path
) -> None:
    root, first, whole = _first_outlived(fleet, tmp_path)
    # A node whose clock fell a day behind writes into the day-old segment's file again: a
    # new file by a name the closed segment was made from (a new inode, shorter than it was).
    gone = next(n for n in closed.read_manifest(root, first).files if "telemetry" in n)  # type: ignore[union-attr]
    again = root / gone
    node = again.stem
    again.parent.mkdir()  # (its segment's directory went with its last file)
    again.write_text(json.dumps({"v": 1, "kind": "host", "ts": START + 5.0, "node": node}) + "\n")
    back = read_frame(root)
    assert back.count("host") == whole.count("host") + 1  # every record of the others kept
    assert compact(root, LATER).closed == []  # never written again from the one file


def test_a_pass_that_reaches_back_past_raw_retention_reads_closed_segments(
    fleet: Path, tmp_path: Path
) -> None:
    root, names = _closed_store(fleet, tmp_path)
    pruned_at = segments.span(names[0])[1] + DAY  # type: ignore[index]
    _prune_raw(root, pruned_at)
    settings = build_settings([Layer("test", {"store": {"root": str(root)}})])
    # The controller's analyzer, its clock the pruning host's: the windows it is asked for
    # reach back to the segment whose files are gone, which its listing cannot find.
    incremental = Analyzer(settings, clock=lambda: pruned_at)
    at = START + 1440.0
    assert incremental.analyze(at).to_dict() == analyze(root, settings, at).to_dict()
    assert incremental.cold_passes == 1


def test_readers_find_the_same_records_and_verdicts_once_every_json_lines_file_is_gone(
    fleet: Path, tmp_path: Path
) -> None:
    root, _ = _closed_store(fleet, tmp_path)
    settings = load_settings(environ={})
    at = START + 1440.0
    raw = read_frame(root, closed_segments=False)
    window = read_frame(root, since=START + 700.0, until=START + 900.0)
    before = analyze(root, settings, at).to_dict()
    newest = analyze(root, settings).to_dict()  # from the newest records, as an idle store
    report = _prune_raw(root, LATER + DAY)
    assert len(report.raw_files) > 0 and not list((root / "telemetry").rglob("*.jsonl"))
    assert not list((root / "steps").rglob("*.jsonl"))
    back = read_frame(root)
    _same_records(raw, back)
    assert (back.files, back.lines, back.bad) == (raw.files, raw.lines, raw.bad)
    assert analyze(root, settings, at).to_dict() == before
    assert analyze(root, settings).to_dict() == newest
    assert any(v["verdict"] == "suspect" for v in newest["nodes"]), "a fault to agree on"
    _same_records(window, read_frame(root, since=START + 700.0, until=START + 900.0))


def test_the_controllers_analyzer_goes_cold_into_segments_without_json_lines(
    fleet: Path, tmp_path: Path
) -> None:
    root, names = _closed_store(fleet, tmp_path)
    settings = load_settings(environ={})
    old = START + 400.0
    want = analyze(root, settings, old).to_dict()
    _prune_raw(root, segments.span(names[1])[1] + DAY)  # type: ignore[index]  # 23:50, 00:00
    assert not _files_of(root, names[0]) and not _files_of(root, names[1])
    inc = Analyzer(settings, root, clock=lambda: SOON)
    inc.analyze()  # the newest records, from the JSON Lines
    assert inc.analyze(old).to_dict() == want and inc.cold_passes == 1


def test_the_controllers_listing_keeps_only_files_a_pass_or_the_leader_may_need(
    fleet: Path, tmp_path: Path
) -> None:
    """The controller's analyzer lists closed segments only while its passes read them or
    the leader may close them again (they may still grow): weeks of them are millions of
    names it would hold. A segment not closed stays, however old (the leader closes it); a
    store whose every listed file is older is analysed cold, from Parquet, as
    ``guardctl analyze`` does."""
    root, names = _closed_store(fleet, tmp_path)
    settings = load_settings(environ={})
    everything = sorted(source_files(root))
    soon = Analyzer(settings, root, clock=lambda: SOON)
    assert soon.analyze().to_dict() == analyze(root, settings).to_dict()
    assert sorted(f for g in soon.segment_files().values() for f in g) == everything
    assert soon.cold_passes == 0
    layout.manifest_path(root, names[1]).unlink()  # 00:00 no longer closed
    idle = Analyzer(settings, root, clock=lambda: LATER)  # a day on, nothing written since
    assert idle.analyze().to_dict() == analyze(root, settings).to_dict()
    assert idle.cold_passes == 1  # the newest records are in closed segments: read cold
    assert set(idle.segment_files()) == {names[1]}  # the one segment left to close
    looked = {os.path.basename(d) for d in idle._listing._dirs}  # its directories, not others'
    assert names[1] in looked and not looked & {names[0], *names[2:]}
    jsonl = [os.fspath(p) for p in _files_of(root, names[1]) if p.suffix == ".jsonl"]
    assert sorted(idle.segment_files()[names[1]]) == jsonl
    # Asked for a time its listing left out: the files of then are listed again.
    at = START + 1440.0
    assert idle.analyze(at).to_dict() == analyze(root, settings, at).to_dict()


def test_passes_over_an_idle_store_read_it_once_while_nothing_changes(
    fleet: Path, tmp_path: Path
) -> None:
    root, names = _closed_store(fleet, tmp_path)
    layout.manifest_path(root, names[1]).unlink()  # a segment left to close: still listed
    settings = load_settings(environ={})
    clock = [LATER]  # a day on, nothing written since
    idle = Analyzer(settings, root, clock=lambda: clock[0])

    def cold_after(seconds: float) -> int:
        clock[0] += seconds
        assert idle.analyze().to_dict() == analyze(root, settings).to_dict()
        return idle.cold_passes

    assert cold_after(0.0) == 1
    assert cold_after(60.0) == 1  # nothing it could read changed: the same pass
    _append_late_record(root, names[1])  # a file it listed grew
    assert cold_after(60.0) == 2
    assert cold_after(60.0) == 2
    compact(root, LATER)  # a segment closed
    assert cold_after(60.0) == 3
    assert cold_after(incremental.IDLE_REUSE_S - 60.0) == 3
    assert cold_after(60.0) == 4  # however still the store, read again that often


def test_raw_retention_past_the_retention_is_the_retention(fleet: Path, tmp_path: Path) -> None:
    root, names = _closed_store(fleet, tmp_path)
    now = LATER + 30 * DAY
    report = store.prune(root, 40 * DAY, raw_older_than_s=60 * DAY, now=now)
    assert report.raw_cutoff == report.cutoff == now - 40 * DAY
    assert report.files == [] and _files_of(root, names[0])
    # Every JSON Lines file stays; only the mirrors of segments that may no longer grow go.
    assert {Path(f).suffix for f in report.raw_files} == {".cols"}


def test_prune_on_the_command_line_says_which_files_were_raw(fleet: Path, tmp_path: Path) -> None:
    root, _ = _closed_store(fleet, tmp_path)

    def prune(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "guardctl", "store", "prune", "--store", str(root), *args],
            env={k: v for k, v in os.environ.items() if not k.startswith("GUARDCTL_")},
            capture_output=True,
            text=True,
            timeout=120,
        )

    # the fleet is years old: --older-than keeps it, --raw-older-than lets its JSON Lines go
    proc = prune("--older-than", "100000d", "--raw-older-than", "12h", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["count"] == 0 and report["raw_count"] == len(report["raw_files"]) > 0
    assert report["raw_kept"] == {} and all(Path(f).exists() for f in report["raw_files"])
    proc = prune("--older-than", "100000d")  # the raw retention of the settings: a day
    assert proc.returncode == 0, proc.stderr
    json_lines = sum(f.endswith(".jsonl") for f in report["raw_files"])
    mirrors = report["raw_count"] - json_lines
    assert f"{json_lines} JSON Lines files and {mirrors} column mirrors of closed" in proc.stdout
    assert not any(Path(f).exists() for f in report["raw_files"])
    bad = prune("--raw-older-than", "soon")
    assert bad.returncode == 2 and "invalid duration" in bad.stderr


@pytest.mark.parametrize("bad", [0, -1.0])
def test_raw_retention_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="raw_retention_hours: must be positive"):
        StoreSettings(raw_retention_hours=bad)
    with pytest.raises(ConfigError) as err:
        build_settings([Layer("site.toml", {"store": {"raw_retention_hours": bad}})])
    assert "raw_retention_hours: must be positive" in str(err.value)
    assert "\n" not in str(err.value)
    assert StoreSettings().raw_retention_hours == 24.0


def test_a_store_in_both_layouts_reads_closes_and_prunes_as_one(
    fleet: Path, tmp_path: Path
) -> None:
    """Agents upgraded one by one: the first segment as earlier versions wrote it (a
    directory per node, ``telemetry/<node>/<segment>.jsonl``), the second half each way, the
    rest in segments' directories; mirrors moved with their files."""
    root = _copy(fleet, tmp_path / "store")
    names = _names(root)
    whole = read_frame(root, closed_segments=False)
    first, second = (len(list((root / "telemetry" / n).glob("*.jsonl"))) for n in names[:2])
    moved = 0
    for name in names[:2]:
        for j, path in enumerate(sorted((root / "telemetry" / name).glob("*.jsonl"))):
            if name == names[1] and j % 2:
                continue
            old = root / "telemetry" / path.stem / f"{name}.jsonl"
            old.parent.mkdir(exist_ok=True)
            for suffix in (".jsonl", ".cols"):
                if path.with_suffix(suffix).exists():
                    os.rename(path.with_suffix(suffix), old.with_suffix(suffix))
            moved += 1
    (root / "telemetry" / names[0]).rmdir()  # (empty: written by no agent of this version)
    left = len(list((root / "telemetry" / names[1]).glob("*.jsonl")))
    assert second > 2 and left == second // 2 and moved == first + second - left
    _same_records(whole, read_frame(root, closed_segments=False))
    settings = load_settings(environ={})
    assert analyze(root, settings, SOON).to_dict() == analyze(fleet, settings, SOON).to_dict()
    assert sorted(compact(root, LATER).closed) == names  # each from the files of both layouts
    _same_records(whole, read_frame(root))
    done = _prune_raw(root, LATER + DAY)
    assert done.raw_files and not list((root / "telemetry").iterdir())  # directories too
    _same_records(whole, read_frame(root))


def test_a_cold_pass_lists_only_the_directories_of_the_segments_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    simulate(
        root, nodes=16, duration=4800.0, seed=3, start=START, segment_minutes=10, faults="none"
    )
    names = _names(root)
    listed: list[str] = []
    real = loading._list_dir

    def counted(directory: str) -> tuple[list[str], list[str]] | None:
        listed.append(directory)
        return real(directory)

    monkeypatch.setattr(loading, "_list_dir", counted)
    settings = load_settings(environ={})
    span = engine.steps_needed(settings.analyze)  # 30 minutes, and the clock skew's margin
    frame = engine.load_recent(root, settings, span, LATER)
    wanted = segments.recent(names, span, LATER)
    assert wanted and len(wanted) < len(names) - 2
    assert {os.path.basename(d) for d in listed} & set(names) == set(wanted)
    assert frame.records
    assert frame.span()[0] >= segments.span(wanted[0])[0] - segments.SKEW_S  # type: ignore[index]
    assert (
        analyze(root, settings).to_dict()
        == analyze(
            root,
            settings,
            frame.span()[1],  # type: ignore[index]
        ).to_dict()
    )
