"""The incremental analyzer: a pass that carries its state gives what a cold pass gives.

A simulated fleet is replayed into a store minute by minute, as the agents and
probes write it (JSON Lines plus their column mirrors); after each minute an
:class:`~guardctl.analyze.incremental.Analyzer` that has seen every earlier
minute and a cold :func:`~guardctl.analyze.analyze` must return the same
analysis, down to the evidence and the input counts. The replay adds what real
stores do: records that arrive late, a line caught half written, files without
mirrors, a file cut short and one replaced, and a new hour's files.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from guardctl.analyze import analyze, features, incremental
from guardctl.analyze.features import Table, WindowPart
from guardctl.analyze.frame import Frame
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.load import Listing, source_files
from guardctl.analyze.ring import Ring
from guardctl.config import Settings, load_settings
from guardctl.simulate import simulate
from guardctl.storage import segments
from guardctl.telemetry import mirror
from guardctl.telemetry.schema import dumps, make_record

# 10 minutes before an hour starts: the replay crosses into a new hour's files.
START = 1_764_547_200.0 - 600


class Replay:
    """Appends a finished trace's lines to a store as time passes, mirrors kept as writers do."""

    def __init__(self, src: Path, dst: Path, unmirrored: int = 0) -> None:
        self.src, self.dst = src, dst
        self.lines: dict[str, list[tuple[float, bytes]]] = {}
        for path in sorted(src.rglob("*.jsonl")):
            rel = os.fspath(path.relative_to(src))
            with open(path, "rb") as fh:
                self.lines[rel] = [(json.loads(line)["ts"], line) for line in fh]
        self.done = dict.fromkeys(self.lines, 0)
        self.held: dict[str, float] = {}  # file -> until when its lines are held back
        names = sorted(self.lines)
        self.plain = set(names[1 : 1 + unmirrored * 7 : 7])  # written without a mirror
        self.mirror = mirror.Mirror()
        self.appended = {}

    def advance(self, t: float) -> None:
        self.appended: dict[str, int] = {}  # bytes appended per file by this call
        for rel, lines in self.lines.items():
            if self.held.get(rel, -1.0) > t:
                continue
            i = self.done[rel]
            j = i
            while j < len(lines) and lines[j][0] <= t:
                j += 1
            if j > i:
                self.append(rel, b"".join(line for _, line in lines[i:j]))
                self.done[rel] = j

    def append(self, rel: str, data: bytes) -> None:
        path = self.dst / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as fh:
            start = fh.tell()
            fh.write(data)
        if rel not in self.plain:
            self.mirror.append(path, start, data)
        self.appended[rel] = self.appended.get(rel, 0) + len(data)


Replays = Callable[..., Replay]


@pytest.fixture
def replays() -> Iterator[Replays]:
    """Replays that close their column files at the end of the test (each holds one open
    file per store file, 600 and more: three tests' worth passed the open-files limit)."""
    made: list[Replay] = []

    def make(src: Path, dst: Path, unmirrored: int = 0) -> Replay:
        made.append(Replay(src, dst, unmirrored))
        return made[-1]

    yield make
    for replay in made:
        replay.mirror.close()


def _start(
    replays: Replays,
    trace: Path,
    tmp_path: Path,
    unmirrored: int = 0,
    settings: Settings | None = None,
) -> tuple[Path, Replay, Settings, Analyzer]:
    """A store the trace is replayed into, its settings and an analyzer over it."""
    store = tmp_path / "store"
    replay = replays(trace, store, unmirrored)
    settings = settings or load_settings(environ={})
    return store, replay, settings, Analyzer(settings, store)


def _by_node(replay: Replay) -> list[str]:
    """The agents' files of a replay, each node's segments one after the other."""
    files = (r for r in replay.lines if r.startswith("telemetry"))
    return sorted(files, key=lambda rel: (Path(rel).stem, rel))


def _same(inc: Analyzer, store: Path, settings: Settings, at: float | None = None) -> dict:
    got = inc.analyze(at).to_dict()
    want = analyze(store, settings, at).to_dict()
    if at is not None:
        got, want = _without_records(got), _without_records(want)
    assert got == want
    return got


def _without_records(analysis: dict) -> dict:
    """A cold pass at a given time skips the cache segments of parsed (unmirrored) files
    that lie wholly outside its windows, so its record count depends on how its cache
    happens to be cut; everything else must be the same."""
    analysis["input"].pop("records")
    return analysis


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("trace")
    simulate(src, nodes=40, duration=1500.0, seed=3, faults="all", start=START)
    return src


@pytest.mark.parametrize(
    "read_bytes", [incremental.READ_BYTES, 40_000], ids=["one-group", "small-groups"]
)
def test_passes_a_minute_apart_equal_cold_passes(
    trace: Path,
    tmp_path: Path,
    replays: Replays,
    read_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 40 kB: the files' new rows are read and decoded a few files at a time, as a first
    # pass at 100k GPUs reads them.
    monkeypatch.setattr(incremental, "READ_BYTES", read_bytes)
    store, replay, settings, inc = _start(replays, trace, tmp_path, unmirrored=3)
    grid = Analyzer(settings, store, grid_s=60.0)  # the controller's: windows on the minute
    telemetry = _by_node(replay)
    late, cut, replaced = telemetry[3], telemetry[5], telemetry[9]
    replay.held[late] = START + 700  # an agent that catches up four minutes late
    # and one whose first 11 minutes come at once, into windows judged before
    replay.held[telemetry[6]] = START + 650
    suspects = set()
    placed: list[float] = []  # the share of the kept step records each pass placed again
    kept: dict[int, int] = {}  # tables of the grid's pass taken from earlier passes
    for minute in range(5, 25):
        t = START + 60 * minute
        replay.advance(t)
        if minute == 8:  # half a line written: counted as truncated, read whole next pass
            nxt = replay.lines[telemetry[0]][replay.done[telemetry[0]]][1]
            replay.append(telemetry[0], nxt[:40])
            replay.lines[telemetry[0]][replay.done[telemetry[0]]] = (0.0, nxt[40:])
        if minute == 14:  # a file cut short in place (its mirror is now ahead of it)
            path = store / cut
            os.truncate(path, os.path.getsize(path) // 2)
        if minute == 18:  # a file replaced by a copy (another inode)
            path = store / replaced
            copy = path.with_suffix(".tmp")
            copy.write_bytes(path.read_bytes())
            os.replace(copy, path)
        got = _same(inc, store, settings)
        read = dict(inc.read)
        aligned = grid.analyze().to_dict()
        end = aligned["window"]["end"]
        assert end % 60 == 0 and t - 60 <= end <= t
        assert _without_records(aligned) == _without_records(
            analyze(store, settings, end).to_dict()
        )
        kept[minute] = grid.read["tables_kept"]
        placed.append(read["steps_placed"] / max(inc._kept["step"].n, 1))
        suspects |= {n["node"] for n in got["nodes"] if n["verdict"] == "suspect"}
        if minute % 3 == 0:
            _same(inc, store, settings, at=t - 45)  # an explicit time, a little earlier
    assert suspects, "the faulty fleet shows suspects (the comparison is not of empty passes)"
    # The last pass read the minute from the mirrors; it parsed only the unmirrored files.
    # The last pass read its minute from the mirrors, and parsed only the files without a
    # usable one: unmirrored, the half-written line's (its mirror stops there), cut, replaced.
    unmirrored = replay.plain | {telemetry[0], cut, replaced}
    parse = sum(n for rel, n in replay.appended.items() if rel in unmirrored)
    assert 0 < read["parsed_bytes"] <= parse
    assert read["mirror_rows"] * mirror.WIDTH > 10 * parse
    assert inc.restarts == 2  # the cut and the replaced file, each once
    # Steps are placed again only where new records joined them (the first pass and the
    # two restarts place them all).
    assert sorted(placed)[len(placed) // 2] < 0.5, placed
    assert "T00" in Path(telemetry[1]).parent.name  # (of the node of telemetry[0])
    # A pass judges two older windows unchanged and takes them as they are (two windows
    # of four tables): those the pass five minutes before judged, or, in the five minutes
    # after a first pass or a restart (the cut file, the replaced one), those that pass
    # figured ahead; not a window a late agent's minutes joined.
    assert all(kept[m] == 8 for m in (6, 7, 8, 9, 10, 15, 16, 19, 20, 24)), kept
    assert kept[5] == kept[14] == kept[18] == 0 and kept[11] < 8, kept
    inc.close()


def test_a_pass_leaves_no_reference_cycles(trace: Path, tmp_path: Path, replays: Replays) -> None:
    """What a pass frees goes by reference counting: it leaves nothing only the cycle
    collector could free (a daemon passing every minute would otherwise hold it until the
    collector's next full run)."""
    _, replay, _, inc = _start(replays, trace, tmp_path)
    for minute in range(5, 9):
        replay.advance(START + 60 * minute)
        gc.collect()
        inc.analyze()
        assert gc.collect() == 0, "a pass left reference cycles"
    inc.close()


def test_a_rank_table_stale_for_a_few_jobs_gets_their_rows_again_as_whole_ones_are_figured(
    trace: Path, tmp_path: Path, replays: Replays, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step records placed into a kept window late (a job's ranks straddle a minute; a
    file without a mirror, whose tails are read for one pass only) stale only their jobs'
    rows of its rank table: those are figured again, and the table is, column for column
    and bit for bit, the one figured whole; the passes give what cold passes give."""
    redone: list[int] = []
    again = features._rank_rows_again

    def checked(
        frame: Frame, rows: features.Rows, old: Table, jobs: np.ndarray, low_q: float
    ) -> Table:
        got = again(frame, rows, old, jobs, low_q)
        whole = features._narrowed(features.rank_table(frame, rows, low_q))
        assert got.narrowed == whole.narrowed and list(got.cols) == list(whole.cols)
        for name, values in whole.cols.items():
            assert got[name].dtype == values.dtype and got[name].tobytes() == values.tobytes()
        redone.append(len(jobs))
        return got

    monkeypatch.setattr(features, "_rank_rows_again", checked)
    store, replay, settings, _ = _start(replays, trace, tmp_path, unmirrored=3)
    grid = Analyzer(settings, store, grid_s=60.0)
    # One rank's steps (its file in each hour) written two minutes late, now and then.
    rank = min(r for r in replay.lines if r.startswith("steps/")).rsplit(".", 2)[0] + "."
    for minute in range(5, 25):
        if minute % 4 == 0:
            replay.held.update(
                dict.fromkeys(
                    [r for r in replay.lines if r.startswith(rank)], START + 60 * (minute + 2) + 1
                )
            )
        replay.advance(START + 60 * minute)
        aligned = grid.analyze().to_dict()
        want = analyze(store, settings, aligned["window"]["end"]).to_dict()
        assert _without_records(aligned) == _without_records(want)
    assert redone and len(redone) >= 3, redone  # (the fleet's jobs: some of them each time)
    assert grid.restarts == 0


def test_a_pass_before_what_is_kept_runs_cold(
    trace: Path, tmp_path: Path, replays: Replays
) -> None:
    store, replay, settings, inc = _start(replays, trace, tmp_path)
    for minute in (5, 10, 15, 20, 25):
        replay.advance(START + 60 * minute)
        _same(inc, store, settings)
    _same(inc, store, settings, at=START + 400)
    assert inc.cold_passes == 1


def test_agent_records_pass_as_in_a_cold_pass(
    trace: Path, tmp_path: Path, replays: Replays
) -> None:
    """Collector health records (one collector failing) reach the verdicts as a cold pass's."""
    store, replay, settings, inc = _start(replays, trace, tmp_path)
    telemetry = sorted(r for r in replay.lines if r.startswith("telemetry"))
    node = json.loads(replay.lines[telemetry[2]][0][1])["node"]
    unknown = set()
    for minute in (5, 10, 15, 20):
        t = START + 60 * minute
        replay.advance(t)
        lines = [
            dumps(
                make_record(
                    "agent",
                    node,
                    t - s,
                    collector="nvml",
                    state="error",
                    ok=False,
                    duration_s=0.01,
                    error="NVML_ERROR_GPU_IS_LOST",
                )
            )
            + "\n"
            for s in (20.0, 10.0)
        ]
        replay.append(telemetry[2], "".join(lines).encode())
        got = _same(inc, store, settings)
        unknown |= {n["node"] for n in got["nodes"] if n["verdict"] == "unknown"}
    assert node in unknown, "the failing collector shows in the verdicts"


def test_directories_are_listed_again_only_when_they_change(tmp_path: Path) -> None:
    """The kept listing equals a fresh one after every change, and lists nothing when none."""
    store = tmp_path / "store"
    for rel in (
        "telemetry/a/20261202T10.jsonl",
        "telemetry/b/20261202T10.jsonl",
        "steps/7/a.r0.20261202T10.jsonl",
    ):
        (store / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / rel).write_bytes(b"")
    listing = Listing()
    listing.SETTLE_S = 0.2  # this file system's times have far finer ticks than that
    dirs = 5  # telemetry, telemetry/a, telemetry/b, steps, steps/7
    first = listing.files(store)
    assert first == source_files(store) and listing.listed == dirs
    # Within SETTLE_S of first seeing a directory's time, an entry made in the same tick
    # would not change it: every directory is listed again.
    assert listing.files(store) is first and listing.listed == dirs
    time.sleep(0.3)
    assert listing.files(store) is first and listing.listed == dirs  # the settling listing
    assert listing.files(store) is first and listing.listed == 0
    (store / "telemetry/a/20261202T11.jsonl").write_bytes(b"")
    (store / "telemetry/b/20261202T10.jsonl").unlink()
    (store / "telemetry/c").mkdir()
    (store / "telemetry/c/20261202T11.jsonl").write_bytes(b"")
    (store / "telemetry/c/20261202T11.cols").write_bytes(b"")
    changed = listing.files(store)
    assert changed == source_files(store) and changed is not first
    assert listing.listed == 4  # telemetry (a new directory), a, b and c; steps/ untouched
    assert "telemetry/c/20261202T11.jsonl" in {os.path.relpath(f, store) for f in changed}
    # Directories whose times lie OLD_S behind the clock are trusted at their first listing.
    dirs += 1  # telemetry/c
    fresh = Listing()
    fresh.SETTLE_S, fresh.OLD_S = 100.0, 0.5
    assert fresh.files(store) == changed and fresh.listed == dirs
    assert fresh.files(store) == changed and fresh.listed == dirs  # times are still new
    time.sleep(0.6)
    later = Listing()
    later.SETTLE_S, later.OLD_S = 100.0, 0.5
    assert later.files(store) == changed and later.listed == dirs
    assert later.files(store) == changed and later.listed == 0


def test_a_kept_listing_finds_a_new_hours_files(
    trace: Path, tmp_path: Path, replays: Replays
) -> None:
    """With the listing settled between passes, new files (a new hour) are still read."""
    store, replay, settings, inc = _start(replays, trace, tmp_path)
    inc._listing.SETTLE_S = 0.1
    listed = []
    for minute in range(6, 14):  # the hour turns at minute 10
        replay.advance(START + 60 * minute)
        time.sleep(0.15)
        _same(inc, store, settings)
        listed.append(inc._listing.listed)
    assert 0 in listed, "some passes reused every directory's listing"
    assert max(listed[4:]) > 0, "the new hour's files were found by listing again"


def _two_rank_job(tmp_path: Path) -> Path:
    """45 minutes of a two-rank job, rank 1 twice as slow in the last 15, with its nodes'
    host records: too few ranks for peers, so only the ranks' own history judges them (its
    fastest window: each has a pace of its own, so a window missed shows)."""
    from guardctl.storage import layout

    src = tmp_path / "src"
    files: dict[Path, list[str]] = {}
    for step in range(2700):
        ts = START + step
        for rank in (0, 1):
            node = f"gn{rank + 1:02d}"
            compute = 0.5 * (2 if rank == 1 and step >= 1800 else 1) * (1 + 0.01 * (step % 3))
            compute *= 1 + 0.02 * (step // 300 % 4)  # (each window's pace its own)
            rec = make_record(
                "step",
                node,
                ts,
                job="9",
                rank=rank,
                step=step,
                step_s=1.5,
                compute_s=compute,
                comm_s=1.5 - compute,
            )
            files.setdefault(layout.step_file(src, "9", node, rank, ts), []).append(dumps(rec))
            if step % 10 == 0:
                host = make_record("host", node, ts, cpu_pct=30.0, load1=8.0, mem_used_pct=50.0)
                files.setdefault(layout.node_telemetry_file(src, node, ts), []).append(dumps(host))
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return src


def test_a_small_jobs_own_history_is_kept_as_a_cold_pass_reads_it(
    tmp_path: Path, replays: Replays
) -> None:
    # Off the grid, the step records of the ranks' own history are kept, the others let go.
    replay = replays(_two_rank_job(tmp_path), tmp_path / "store")
    store = tmp_path / "store"
    settings = load_settings(environ={})
    inc = Analyzer(settings, store)
    verdicts = []
    for minute in range(20, 46, 5):
        replay.advance(START + 60 * minute)
        got = _same(inc, store, settings)
        verdicts.append({n["node"]: n["verdict"] for n in got["nodes"]})
    steps = inc._kept["step"]
    assert steps.data["ts"][: steps.n].min() < got["window"]["end"] - 30 * 60
    assert verdicts[0] == {"gn01": "healthy", "gn02": "healthy"}
    assert verdicts[-1] == {"gn01": "healthy", "gn02": "suspect"}
    assert inc.cold_passes == 0


def _history_on_the_grid(
    inc: Analyzer, replay: Replay, store: Path, settings: Settings, minutes: range
) -> list[dict]:
    """The grid analyzer's passes a minute apart, each the same as a cold pass at its time."""
    got = []
    for minute in minutes:
        replay.advance(START + 60 * minute)
        mine = inc.analyze().to_dict()
        assert mine == analyze(store, settings, mine["window"]["end"]).to_dict()
        got.append(mine)
    return got


def _minutes_kept(inc: Analyzer, end: float) -> float:
    steps = inc._kept["step"]
    return float(end - steps.data["ts"][: steps.n].min()) / 60


def test_on_the_grid_a_history_window_keeps_its_rank_rows_not_its_step_records(
    tmp_path: Path, replays: Replays
) -> None:
    # The controller's analyzer keeps each history window's rank rows from the passes that
    # judged it, and lets go of the step records behind its judged windows (and one window
    # more, for placing steps): 20 minutes of them, not 35. A record that joins a history
    # window after its step records went starts the state over (a cold pass reads it).
    settings = load_settings(environ={})
    # A daemon from the job's start: the rank's own history judges it once it slows.
    store = tmp_path / "store"
    replay = replays(_two_rank_job(tmp_path / "a"), store)
    inc = Analyzer(settings, store, grid_s=60.0)
    passes = _history_on_the_grid(inc, replay, store, settings, range(20, 46))
    verdicts = [{n["node"]: n["verdict"] for n in p["nodes"]} for p in passes]
    assert verdicts[0] == {"gn01": "healthy", "gn02": "healthy"}
    assert verdicts[-1] == {"gn01": "healthy", "gn02": "suspect"}
    why = [e for n in passes[-1]["nodes"] if n["node"] == "gn02" for e in n["evidence"]]
    assert why and {e["detector"] for e in why} == {"busy_history"}, why  # its own history
    end = passes[-1]["window"]["end"]
    assert _minutes_kept(inc, end) <= 21
    assert inc.restarts == inc.cold_passes == 0
    # 19 minutes late, into the newest history window: its step records are gone.
    rel = next(r for r in replay.lines if "gn01" in r and "telemetry" not in r)
    late = make_record(
        "step",
        "gn01",
        end - 19 * 60,
        job="9",
        rank=0,
        step=9999,
        step_s=1.5,
        compute_s=0.4,
        comm_s=1.1,
    )
    replay.append(rel, (dumps(late) + "\n").encode())
    _history_on_the_grid(inc, replay, store, settings, range(46, 48))
    assert inc.restarts == 1


def test_a_daemon_started_late_keeps_20_minutes_of_steps_from_its_second_pass(
    tmp_path: Path, replays: Replays
) -> None:
    # Its first pass reads 35 minutes and judges three windows; it figures the rows of the
    # windows later passes read as history that no pass judged, so the next pass lets
    # their step records go.
    settings = load_settings(environ={})
    store = tmp_path / "store"
    replay = replays(_two_rank_job(tmp_path), store)
    inc = Analyzer(settings, store, grid_s=60.0)
    passes = _history_on_the_grid(inc, replay, store, settings, range(35, 37))
    assert _minutes_kept(inc, passes[-1]["window"]["end"]) <= 21
    passes = _history_on_the_grid(inc, replay, store, settings, range(37, 46))
    assert {n["node"]: n["verdict"] for n in passes[-1]["nodes"]} == {
        "gn01": "healthy",
        "gn02": "suspect",
    }
    assert inc.restarts == inc.cold_passes == 0


def test_records_let_go_before_judging_beside_a_tail_read_for_one_pass(
    trace: Path, tmp_path: Path, replays: Replays
) -> None:
    """A first pass over 24 minutes lets go of what no window needs before it judges, while a
    batch its mirror does not cover yet is parsed for that pass only: both passes equal cold."""
    base = load_settings(environ={})
    # Two-minute windows: of 24 minutes, a pass judges 6 and reads steps 14 back.
    two = dataclasses.replace(base, analyze=dataclasses.replace(base.analyze, window_s=120))
    store, replay, settings, inc = _start(replays, trace, tmp_path, settings=two)
    t = START + 60 * 24
    replay.advance(t)
    telemetry = sorted(r for r in replay.lines if r.startswith("telemetry") and "T00" in r)
    rel = telemetry[1]
    lines = replay.lines[rel]
    with open(store / rel, "ab") as fh:  # a batch written, its mirror rows not yet
        fh.write(b"".join(line for ts, line in lines[replay.done[rel] :] if ts <= t + 30))
    _same(inc, store, settings)
    assert inc.read["parsed_bytes"] > 0, "the batch without mirror rows was parsed"
    assert inc._floor > -math.inf, "records were let go in the first pass"
    kept = {kind: cols.n for kind, cols in inc._kept.items()}
    assert kept["step"] and kept["gpu"]
    replay.advance(t + 60)  # the writer's next batch: its mirror catches up
    _same(inc, store, settings)
    assert inc.restarts == 0


def test_a_mirror_replaced_behind_the_one_kept_open(
    trace: Path, tmp_path: Path, replays: Replays
) -> None:
    """Mirrors stay open from pass to pass; one renamed over (a copy, then written on by its
    writer) is read from the new file, after one pass that parses what the old one lacks."""
    store, replay, settings, inc = _start(replays, trace, tmp_path)
    replay.advance(START + 300)
    _same(inc, store, settings)
    rel = sorted(r for r in replay.lines if r.startswith("telemetry"))[0]
    state = inc._files[os.fspath(store / rel)]
    assert state.fd >= 0 and os.fstat(state.fd).st_ino == os.stat(state.cols).st_ino
    copy = state.cols + ".tmp"
    shutil.copyfile(state.cols, copy)
    os.replace(copy, state.cols)
    replay.mirror.forget(store / rel)  # its writer opens the new file next
    parsed = []
    for minute in range(6, 9):
        replay.advance(START + 60 * minute)
        _same(inc, store, settings)
        parsed.append(inc.read["parsed_bytes"])
    assert parsed[0] > 0 and parsed[1:] == [0, 0], parsed  # the old file lacks minute 6
    assert inc.restarts == 0
    assert os.fstat(state.fd).st_ino == os.stat(state.cols).st_ino
    inc.close()
    assert state.fd == -1


@pytest.mark.parametrize("room", [4096, 0], ids=["room", "no room"])
def test_a_pass_opens_only_the_files_it_does_not_hold_open(
    trace: Path, tmp_path: Path, replays: Replays, room: int
) -> None:
    """Mirrors stay open from pass to pass: after the first, a pass opens only the files new
    since the last (a new segment's), and lets go of those of a segment that ended a grace
    ago once they stop growing. Without room to keep files open, it opens every file it
    reads, every pass."""
    store, replay, settings, _ = _start(replays, trace, tmp_path)
    now = [START]
    inc = Analyzer(settings, store, clock=lambda: now[0])
    inc._fd_room = room  # (room for every file; the process's limit is the test's)
    for minute in range(6, 16):  # the hour's segment turns at minute 10
        before = {rel for rel, n in replay.done.items() if n}
        now[0] = START + 60 * minute
        replay.advance(now[0])
        _same(inc, store, settings)
        new = {rel for rel, n in replay.done.items() if n} - before
        if room == 0:
            assert inc.read["files_opened"] == inc.read["mirror_files"] > 0
        elif minute > 6:
            assert inc.read["files_opened"] == len(new), minute
    if room == 0:
        return
    ended = [st for st in inc._files.values() if st.segment == _segment_at(inc, START + 599)]
    growing = [st for st in inc._files.values() if st.segment == _segment_at(inc, START + 600)]
    assert ended and growing
    assert all(st.fd < 0 for st in ended), "an ended segment's files are let go"
    assert all(st.fd >= 0 for st in growing), "a growing segment's files stay open"


def _segment_at(inc: Analyzer, t: float) -> int:
    """The number the analyzer gave the segment that holds time *t*."""
    spans = {num: segments.span(name) for name, num in inc._segment_ids.items()}
    return next(num for num, b in spans.items() if b is not None and b[0] <= t < b[1])


# --- the kept columns --------------------------------------------------------------------


@pytest.mark.parametrize("rings", ["every column", "none", "some"])
def test_kept_columns_let_go_grow_and_wrap_as_plain_arrays_would(
    rings: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records let go (the oldest first, or anywhere), appended past the room, fitted to a
    pass's worth, written around the ring's end: always the records a list would hold. The
    same where no ring can be made (plain memory: the records move at the end), or only
    for some columns."""
    made = iter(range(10**6))

    def no_ring(size: int) -> Ring:
        if rings == "none" or (rings == "some" and next(made) % 2):
            raise OSError(38, "memfd_create: Function not implemented")
        return Ring(size)

    monkeypatch.setattr(incremental, "Ring", no_ring)
    rng = np.random.default_rng(7)
    cols = incremental._Columns("host")
    wrapped, fitted = [], []
    ts: list[float] = []
    load: list[float] = []
    clock = 0.0
    for step in range(400):
        m = int(rng.integers(1, 5000)) if step < 40 or step % 50 else 200_000  # a first pass
        new_ts = clock + rng.random(m) * 60.0
        clock += 60.0
        new_load = rng.random(m)
        cols.append(
            {
                "ts": new_ts,
                "node": np.zeros(m, np.int32),
                "cpu_pct": new_load,
                "load1": new_load,
                "mem_used_pct": new_load,
                "segment": np.zeros(m, np.int32),
            }
        )
        ts += new_ts.tolist()
        load += new_load.tolist()
        have = np.array(ts)
        if step % 3 == 2:  # the oldest minutes go, as a pass a minute lets them go
            mask = ~(have < clock - 600.0)
        else:  # or records anywhere (an hour no longer read)
            mask = rng.random(have.size) > 0.1 if step % 7 == 0 else np.ones(have.size, bool)
        was, room = cols.start, cols.room
        cols.keep(mask)
        wrapped.append(cols.start < was)
        cols.fit()
        fitted.append(cols.room < room)
        ts = have[mask].tolist()
        load = np.array(load)[mask].tolist()
        view = cols.view()
        assert cols.n == len(ts) and cols.n <= cols.room
        assert view["ts"].tolist() == ts
        assert view["load1"].tolist() == load
        assert cols.data["ts"][: cols.n].tolist() == ts
    # around the ring's end along the way, and made shorter after each burst
    assert sum(wrapped) >= 3 and sum(fitted) >= 3


def test_kept_columns_write_again_the_pages_let_go_and_give_back_a_first_passs_hours() -> None:
    """A first pass reads whole hours and keeps a few minutes: the rest is given back. A
    pass a minute later appends a minute and lets go of one: the ring is fitted to that,
    and once around, every page it holds is one written again (none fresh, none given back)."""
    cols, minute = incremental._Columns("host"), 40_000
    minutes = _Minutes(cols, minute)
    minutes(60)
    # ts, node, the segment's tag; the figures packed: zeros in a byte each, load1 (the times,
    # not all of them decimals) as read
    row_bytes = sum(col.dtype.itemsize for col in cols._cols.values())
    assert row_bytes == 8 + 4 + 1 + 1 + 8 + 1
    assert cols.n == 10 * minute and cols.held() <= 12 * minute * row_bytes
    for _ in range(20):
        minutes(1)
        assert cols.view()["load1"][0] == minutes.clock - 600.0 and cols.n == 10 * minute
    assert cols.room <= 12 * minute + 2 * incremental._SMALLEST
    assert cols.held() == cols.room * row_bytes


class _Minutes:
    """Passes a minute apart over kept host records: each appends *k* minutes of *minute*
    records, keeps the last ten minutes and fits the ring (told *per_pass*)."""

    def __init__(self, cols: incremental._Columns, minute: int, per_pass: int = 0) -> None:
        self.cols, self.minute, self.per_pass, self.clock = cols, minute, per_pass, 0.0

    def __call__(self, k: int) -> None:
        ts = self.clock + np.arange(k * self.minute) * (60.0 / self.minute)
        self.clock += 60.0 * k
        z = np.zeros(ts.size)
        self.cols.append(
            {
                "ts": ts,
                "node": z.astype(np.int32),
                "cpu_pct": z,
                "load1": ts,
                "mem_used_pct": z,
                "segment": z.astype(np.int32),
            }
        )
        self.cols.keep(~(self.cols.view()["ts"] < self.clock - 600.0))  # ten minutes kept
        self.cols.fit(self.per_pass)


@pytest.mark.parametrize("told", [True, False])
def test_a_first_pass_told_what_a_pass_adds_fits_the_ring_then_not_later(told: bool) -> None:
    """The analyzer tells the first fit what a pass will add (a minute's records and half
    again): the ring is fitted in the first pass, and the passes after it neither copy it
    nor take a fresh page (every page let go is written again). Not told, the ring is
    fitted a pass or two later, a copy in a steady pass."""
    cols, minute = incremental._Columns("host"), 40_000
    minutes = _Minutes(cols, minute, per_pass=minute * 3 // 2 if told else 0)
    minutes(60)
    first_ring = cols._cols["ts"]._ring
    assert (cols.room <= 12 * minute + 2 * incremental._SMALLEST) is told
    rings = []
    for _ in range(10):
        minutes(1)
        rings.append(cols._cols["ts"]._ring)
        assert cols.n == 10 * minute and cols.view()["load1"][-1] == minutes.clock - 60 / minute
    assert (rings == [first_ring] * 10) is told  # no copy after the first pass
    assert rings[-1] is rings[-2]  # (and, not told, fitted since)
    row_bytes = sum(col.dtype.itemsize for col in cols._cols.values())
    assert cols.held() == cols.room * row_bytes  # nothing given back: every page used again


def test_kept_columns_grow_by_a_copy_when_a_view_outlives_its_pass() -> None:
    cols = incremental._Columns("host")
    first = np.arange(70_000, dtype=np.float64)
    zeros = np.zeros(first.size)
    row: dict[str, np.ndarray] = {
        "ts": first,
        "node": zeros.astype(np.int32),
        "cpu_pct": zeros,
        "load1": first,
        "mem_used_pct": zeros,
        "segment": zeros.astype(np.int32),
    }
    cols.append(row)
    held = cols.view()["ts"]  # a frame still held somewhere (a column kept as read: a view)
    assert held.base is not None
    for _ in range(2):  # past the room: the mapping cannot move under the view
        cols.append(row)
    assert held[:3].tolist() == [0.0, 1.0, 2.0] and held[-1] == 69_999.0
    assert cols.view()["load1"].tolist() == first.tolist() * 3


def _mark_row(start: int, end: int, lines: int, total: int) -> bytes:
    """A mark row as a writer encodes it (guardctl.telemetry.mirror)."""
    row = mirror.HEAD.pack(mirror.MARK, 0, 0, 0, 0.0) + struct.pack("<4q", start, end, lines, total)
    return row.ljust(mirror.WIDTH, b"\0")


def test_tails_read_behind_string_rows_get_them_and_a_mark_standing_for_what_went_before() -> None:
    w = mirror.WIDTH
    files = []
    for k, strings in enumerate((b"", bytes(range(1, w + 1)) * 2, b"\x07" * w)):
        state = incremental._File(segment=0, ino=k, offset=1000 * (k + 1), rows=5 + k)
        state.strings = strings
        state.strings_sum = mirror.checksum(strings) if strings else 2**63 - 1  # (it wraps)
        state.mark = _mark_row(7, 9 + k, 3, 11 * k)
        files.append((state, [state.mark, b"\x05" * w]))  # each tail: its mark and a row
    buf = bytearray()
    behind = []
    for state, tail in files:
        behind.append((len(buf), state))
        buf += b"\xee" * len(state.strings) + b"".join(tail)  # room, then the tail read
    got = np.frombuffer(buf, np.uint8).copy()
    incremental._put_behind(got, behind)
    want = b""
    for state, tail in files:
        total = mirror.mark_checksum(state.strings_sum, 0, state.offset, 0)
        want += state.strings + _mark_row(0, state.offset, 0, total) + tail[1]
    assert got.tobytes() == want
    # A tail that does not begin with the mark last read: the mirror was written again.
    files[1][0].mark = _mark_row(7, 10, 4, 11)
    with pytest.raises(incremental._Restart):
        incremental._put_behind(np.frombuffer(buf, np.uint8).copy(), behind)


def test_a_passs_records_are_put_in_the_order_of_their_minutes() -> None:
    cols = incremental._Columns("host")
    ts = np.array([130.0, 5.0, 61.0, np.nan, 10.0, 125.0, 60.0, np.inf])
    zeros = np.zeros(ts.size)
    row: dict[str, np.ndarray] = {
        "ts": ts,
        "node": np.arange(ts.size, dtype=np.int32),
        "cpu_pct": zeros,
        "load1": zeros,
        "mem_used_pct": zeros,
        "segment": zeros.astype(np.int32),
    }
    cols.append(row)
    cols.by_minute(1)  # the first record stays where it is
    got = cols.view()
    # by the minute that ends at or after each (60 s: the first), in order within one; no
    # time (or no minute) last
    assert got["node"].tolist() == [0, 1, 4, 6, 2, 5, 3, 7]


def test_steps_whose_time_moves_to_another_minute_are_kept_in_minute_order(
    tmp_path: Path, replays: Replays
) -> None:
    """A rank whose clock is 40 s behind its job's writes each step 40 s before the others:
    a pass places those steps by it alone, the next by the job's median, a minute on. The
    kept records that moved are put in their new minute (a window stays one run of records,
    read in place), and every pass equals a cold one."""
    from guardctl.storage import layout

    src, store = tmp_path / "src", tmp_path / "store"
    files: dict[Path, list[str]] = {}
    for step in range(0, 1200, 2):
        for rank in (0, 1, 2):
            node = f"cn{rank + 1:02d}"
            ts = START + step - (40 if rank == 0 else 0)
            rec = make_record(
                "step",
                node,
                ts,
                job="7",
                rank=rank,
                step=step,
                step_s=2.0,
                compute_s=1.5,
                comm_s=0.5,
            )
            files.setdefault(layout.step_file(src, "7", node, rank, ts), []).append(dumps(rec))
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    replay = replays(src, store)
    settings = load_settings(environ={})
    inc = Analyzer(settings, store, grid_s=60.0)
    moved = 0
    for minute in range(8, 20):
        replay.advance(START + 60 * minute + 30)
        before = inc._kept["step"].data["end"][: inc._kept["step"].n].copy()
        got = inc.analyze().to_dict()
        assert _without_records(got) == _without_records(
            analyze(store, settings, got["window"]["end"]).to_dict()
        )
        cols = inc._kept["step"]
        minutes = np.ceil(cols.data["end"][: cols.n] / 60)
        assert (np.diff(minutes) >= 0).all(), f"minute {minute}: kept out of minute order"
        old = np.ceil(before / 60)
        moved += int(np.count_nonzero(np.sort(old) != np.sort(minutes[: old.size])))
    assert moved, "some kept steps moved to the next minute"


def test_gpu_records_that_name_their_job_give_a_kept_windows_peers_as_a_cold_pass(
    tmp_path: Path, replays: Replays
) -> None:
    """Without the probe, the GPU records' job labels (dcgm-exporter's hpc_job) make the
    peer groups: a node whose records arrive late, into windows judged before, and name
    the other job there, moves to that job's peers as a cold pass moves it (a window's
    jobs are figured again when its GPU records change)."""
    from guardctl.storage import layout

    src, store = tmp_path / "src", tmp_path / "store"
    files: dict[Path, list[str]] = {}
    for s in range(0, 2400, 10):
        ts = START + s
        for n in range(10):
            node = f"ln{n:02d}"
            job = "B" if n >= 6 or (n == 3 and s >= 1200) else "A"  # ln03: B from minute 20
            # Job A's GPUs clock lower (the fleet's most): ln03, still clocked as A's, is
            # slow only beside its new peers.
            clock = (1980.0 if n >= 6 else 1580.0) + 15.0 * (n % 3)
            for gpu in range(2):
                rec = make_record(
                    "gpu",
                    node,
                    ts,
                    gpu=gpu,
                    sm_clock_mhz=clock,
                    power_w=650.0,
                    power_limit_w=700.0,
                    temp_c=60.0,
                    util_pct=95.0,
                    job=job,
                )
                hourly = layout.node_telemetry_file(src, node, ts, 60)  # "its second hour"
                files.setdefault(hourly, []).append(dumps(rec))
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    replay = replays(src, store)
    late = max(r for r in replay.lines if r.endswith("/ln03.jsonl"))  # its second hour's file
    replay.held[late] = START + 60 * 33  # ln03's agent catches up after 12 minutes
    settings = load_settings(environ={})
    grid = Analyzer(settings, store, grid_s=60.0)
    kept, flagged = [], []
    for minute in range(22, 40):
        replay.advance(START + 60 * minute)
        got = grid.analyze().to_dict()
        end = got["window"]["end"]
        assert _without_records(got) == _without_records(analyze(store, settings, end).to_dict())
        kept.append(grid.read["tables_kept"])
        flagged.append({n["node"]: n["verdict"] for n in got["nodes"]}.get("ln03"))
    assert max(kept) > 0, "some passes took windows' tables from earlier passes"
    assert "suspect" not in flagged[:11] and flagged[-1] == "suspect", "judged once in B's group"


def test_kept_records_know_their_segment_by_a_tag_no_two_read_share(tmp_path: Path) -> None:
    """The kept records hold a byte of their segment's number: letting go of a segment lets
    go of its records only (and of the kept tables of the windows they lay in), and a segment
    numbered 256 after one still read starts the state over rather than share its tag."""
    inc = Analyzer(Settings(), tmp_path)
    older, newer = inc._segment_id("2026-12-04T10"), inc._segment_id("2026-12-04T11")
    tables = {t: [] for t in incremental.TABLES} | {"nodes": ["node1"]}
    for number, times in ((older, [1.0, 2.0]), (newer, [3.0, 4.0, 5.0])):
        host = {"ts": np.array(times), "node": np.zeros(len(times), np.int32)}
        host |= {name: np.full(len(times), 1.0) for name in ("cpu_pct", "load1", "mem_used_pct")}
        inc._add({"host": host}, tables, np.array([number], np.int32), None, True, None)
    assert inc._kept["host"].data["segment"].dtype == np.uint8
    # kept windows' tables: only the one the older segment's records lay in goes with them
    table = Table({"node": np.zeros(1, np.int64)})
    for key in ((2.5, 2.0), (5.0, 2.0)):
        inc._parts[key] = WindowPart(tables={"host": table, "rank": table}, history=table)
    inc._forget(set(), {newer})
    kept = inc._kept["host"]
    assert kept.data["ts"][: kept.n].tolist() == [3.0, 4.0, 5.0]
    older_window, newer_window = inc._parts[(2.5, 2.0)], inc._parts[(5.0, 2.0)]
    assert set(older_window.tables) == {"rank"} and older_window.history is table
    assert set(newer_window.tables) == {"host", "rank"}
    assert list(inc._counts) == [newer]
    inc._next_segment = newer + 256
    with pytest.raises(incremental._Restart):
        inc._segment_id("2026-12-04T12")
    inc._next_segment = newer + 255
    assert inc._segment_id("2026-12-04T12") == newer + 255
