"""Telemetry segments: one naming for every length, and a store cut short reads as an hourly one."""

from __future__ import annotations

import calendar
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from guardctl import probe
from guardctl.agent.daemon import Agent
from guardctl.analyze import analyze
from guardctl.analyze.incremental import Analyzer
from guardctl.analyze.load import segment_groups
from guardctl.config import Layer, Settings, build_settings, load_settings
from guardctl.errors import ConfigError
from guardctl.hooks.run import straggler_summary
from guardctl.sections.agent import AgentSettings
from guardctl.sections.store import StoreSettings
from guardctl.simulate import simulate
from guardctl.storage import layout, segments, store
from guardctl.storage.segments import ALLOWED_MINUTES, OTHER
from guardctl.storage.writer import LineWriter
from guardctl.telemetry.schema import dumps, make_record, read_path

T10 = float(calendar.timegm((2026, 12, 6, 10, 0, 0)))  # 2026-12-06T10:00:00Z
START = calendar.timegm((2026, 11, 30, 12, 25, 0))  # the simulated traces: 12:25 to 12:50


@pytest.mark.parametrize("minutes", ALLOWED_MINUTES)
def test_every_length_names_and_parses_back(minutes: int) -> None:
    length = minutes * 60
    for ts in (T10, T10 + 0.5, T10 + 3599.9, T10 + 86400 * 400 + 1234.5, T10 - 1):
        start = ts - ts % length
        name = segments.segment_name(ts, minutes)
        assert segments.span(name) == (start, start + length)
        assert name.endswith("" if minutes == 60 else f"_{minutes}m")
        telemetry = layout.node_telemetry_file(Path("s"), "n1", ts, minutes)
        step = layout.step_file(Path("s"), "7", "n1", 3, ts, minutes)
        assert telemetry == Path("s/telemetry") / name / "n1.jsonl"
        old_layout = Path("s/telemetry/n1") / f"{name}.jsonl"  # earlier versions': still read
        assert step == Path("s/steps/7") / f"n1.r3.{name}.jsonl"
        for path in (telemetry, old_layout, step, step.with_suffix(".cols")):
            assert segments.segment_of(path) == name
            assert segments.file_span(path) == (start, start + length)


def test_a_short_segment_says_its_start_and_length() -> None:
    assert segments.segment_name(T10 + 615, 10) == "20261206T1010_10m"
    assert segments.segment_name(T10 + 615, 1) == "20261206T1010_1m"
    assert segments.span("20261206T1010_10m") == (T10 + 600, T10 + 1200)


def test_hourly_names_of_old_stores_are_read_as_they_are() -> None:
    assert layout.node_telemetry_file(Path("s"), "n1", T10 + 5, 60).parent.name == "20261206T10"
    assert segments.segment_of("telemetry/n1/20251201T00.jsonl") == "20251201T00"
    assert segments.segment_of("telemetry/20251201T00/n1.jsonl") == "20251201T00"
    assert segments.segment_of("steps/j1/n1.r0.20251201T00.jsonl") == "20251201T00"
    start = float(calendar.timegm((2025, 12, 1, 0, 0, 0)))
    assert segments.file_span("20251201T00.cols") == (start, start + 3600)


OTHERS = [
    "telemetry/n1/notes.jsonl",
    "steps/j1/n1.r020251201T00.jsonl",  # no separator before the name
    "x20251201T00.jsonl",
    "telemetry/n1/20251201T0.jsonl",
    "telemetry/n1/20251201T00.json",
    "telemetry/n1/20251201T00.jsonl\n",
    "telemetry/n1/20261206T1007_10m.jsonl",  # not on its length
    "telemetry/n1/20261206T1000_60m.jsonl",  # an hour is named the short way
    "telemetry/n1/20261206T1000_7m.jsonl",  # 7 does not divide an hour
    "telemetry/n1/20261206T10_10m.jsonl",
    "telemetry/n1/20261301T10.jsonl",  # no such month
    "telemetry/n1/20261131T10.jsonl",  # no such day
    "telemetry/n1/20261206T24.jsonl",
]


def test_files_without_a_segment_name_are_other() -> None:
    for _ in range(2):  # the second round answers from the remembered names
        assert [segments.segment_of(n) for n in OTHERS] == [OTHER] * len(OTHERS)
        assert all(segments.file_span(n) is None for n in OTHERS)
    groups = segments.group_files(["a/20261206T1010_10m.jsonl", *OTHERS, "b/20261206T10.jsonl"])
    assert sorted(groups) == ["20261206T10", "20261206T1010_10m", OTHER]
    assert groups[OTHER] == OTHERS
    # "other" files are always read: their records may be of any time
    assert segments.needed(groups, T10 + 86400, None) == [OTHER]


def test_remembered_names_stay_bounded() -> None:
    for i in range(segments.PARSED_MAX + 10):
        segments.segment_of(f"n1/{i:08d}.jsonl")
    assert segments._parse_name.cache_info().currsize <= segments.PARSED_MAX
    assert segments.segment_of("n1/20261206T1010_10m.jsonl") == "20261206T1010_10m"


def test_needed_segments_keep_the_clock_skew_margin() -> None:
    names = [segments.segment_name(T10 + 600 * i, 10) for i in range(6)] + ["20261206T09"]
    # [10:35, 10:36] and 15 minutes of skew either side: what ends by 10:20 or starts at 10:51
    got = segments.needed(names, T10 + 2100, T10 + 2160)
    assert got == [segments.segment_name(T10 + 600 * i, 10) for i in (1, 2, 3, 4, 5)]
    # a segment ending 15 minutes before since is still read; 15 minutes and a second, not
    assert segments.needed(names, T10 + 1200 + 900, None)[0] == "20261206T1010_10m"
    assert segments.needed(names, T10 + 1200 + 901, None)[0] == "20261206T1020_10m"
    assert segments.needed(names, None, T10 - 900) == ["20261206T09", "20261206T1000_10m"]


def test_the_newest_segment_is_the_latest_start_not_one_of_a_clock_ahead() -> None:
    names = ["20261206T09", "20261206T1040_10m", "20261206T10", "20261207T03", OTHER]
    assert segments.newest(names, T10 + 3000) == (T10 + 2400, T10 + 3000)
    assert segments.newest([OTHER]) is None
    # the last 5 minutes before the newest record: that record is at least 10:40
    # (and what starts later, only to name the nodes ahead, and "other")
    got = segments.recent(names, 300, T10 + 3000)
    assert got == ["20261206T10", "20261206T1040_10m", "20261207T03", OTHER]
    assert segments.recent([OTHER], 300) is None
    assert segments.earliest_start(names) == T10 - 3600


@pytest.mark.parametrize("bad", [0, 7, 90, -10, 45])
def test_a_length_that_does_not_divide_an_hour_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="segment_minutes: must divide an hour"):
        StoreSettings(segment_minutes=bad)
    with pytest.raises(ConfigError) as err:
        build_settings([Layer("site.toml", {"store": {"segment_minutes": bad}})])
    assert "segment_minutes: must divide an hour" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_setting_and_the_environment() -> None:
    assert Settings().store.segment_minutes == 10
    configured = build_settings([Layer("site.toml", {"store": {"segment_minutes": 60}})])
    assert configured.store.segment_minutes == 60
    env = segments.ENV_MINUTES
    assert segments.minutes_from_env({}) == 10
    assert segments.minutes_from_env({env: "5"}) == 5
    for bad in ("7", "ten", "", "10.0"):
        assert segments.minutes_from_env({env: bad}) == 10


def test_the_agent_writes_its_segments_and_closes_the_older_file(tmp_path: Path) -> None:
    store.init(tmp_path)
    cfg = AgentSettings(collectors=("host",), status_file="")
    agent = Agent(cfg, tmp_path, "n1", segment_minutes=10)
    for offset in (595.0, 605.0, 1190.0):
        agent.sample(T10 + offset)
    fds = dict(agent.store.writer._fds)
    agent.close()
    names = sorted(p.parent.name for p in (tmp_path / "telemetry").glob("*/n1.jsonl"))
    assert names == ["20261206T1000_10m", "20261206T1010_10m"]
    assert list(fds) == [tmp_path / "telemetry" / "20261206T1010_10m" / "n1.jsonl"]


def test_the_line_writer_keeps_one_descriptor_per_series_of_files(tmp_path: Path) -> None:
    writer = LineWriter()
    for ts in (T10, T10 + 60, T10 + 120):  # a node's files of three segments: the last open
        for node in ("n1", "n2"):  # (two nodes in each segment's directory: both open)
            writer.append(layout.node_telemetry_file(tmp_path, node, ts, 1), b"{}\n")
    for rank in (0, 1):
        writer.append(layout.step_file(tmp_path, "7", "n1", rank, T10, 1), b"{}\n")
    writer.append(layout.step_file(tmp_path, "7", "n1", 0, T10 + 60, 1), b"{}\n")
    assert sorted(writer._fds) == sorted(
        [
            *(layout.node_telemetry_file(tmp_path, node, T10 + 120, 1) for node in ("n1", "n2")),
            layout.step_file(tmp_path, "7", "n1", 0, T10 + 60, 1),
            layout.step_file(tmp_path, "7", "n1", 1, T10, 1),
        ]
    )
    writer.close()


def test_a_segments_directory_is_readable_by_all_whatever_the_agents_umask(
    tmp_path: Path,
) -> None:
    writer = LineWriter()
    old = os.umask(0o077)
    try:
        writer.append(layout.node_telemetry_file(tmp_path, "n1", T10, 10), b"{}\n")
        writer.append(layout.node_telemetry_file(tmp_path, "n2", T10, 10), b"{}\n")
    finally:
        os.umask(old)
        writer.close()
    directory = layout.node_telemetry_file(tmp_path, "n1", T10, 10).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert sorted(p.name for p in directory.iterdir()) == ["n1.jsonl", "n2.jsonl"]


def test_a_probe_without_settings_takes_the_length_from_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(segments.ENV_MINUTES, "5")
    monkeypatch.setenv("GUARDCTL_AGENT_SOCKET", "")
    probe.configure(store=tmp_path, job="42", rank=1, node="node2", flush_interval_s=60)
    try:
        with probe.step():
            pass
        assert probe.flush()
    finally:
        probe.configure(store=tmp_path, job="42", rank=1, node="node2", flush_interval_s=60)
    (path,) = (tmp_path / "steps" / "42").glob("*.jsonl")
    assert path.name.endswith("_5m.jsonl")
    bounds = segments.file_span(path)
    (record,) = read_path(path).records
    assert bounds is not None and bounds[0] <= record["ts"] < bounds[1] == bounds[0] + 300


# -- a store written in 10-minute segments reads as the same store written hourly ----------------


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The same simulated fleet (agent files and jobs' own step files), hourly and in 10 minutes."""
    out = {}
    for minutes in (60, 10):
        root = tmp_path_factory.mktemp(f"trace{minutes}")
        simulate(root, nodes=40, duration=1500.0, seed=3, start=START, segment_minutes=minutes)
        out[minutes] = root
    return out


def _verdicts(analysis: dict[str, Any]) -> dict[str, Any]:
    """An analysis without what counts files (more of them, the same records)."""
    analysis["input"].pop("files")
    return analysis


def test_ten_minute_files_are_what_the_writers_made(traces: dict[int, Path]) -> None:
    short = traces[10]
    telemetry = {p.parent.name for p in (short / "telemetry").rglob("*.jsonl")}
    steps = {p.name.split(".")[-2] for p in (short / "steps").rglob("*.jsonl")}
    assert telemetry == {f"20261130T12{m}_10m" for m in ("20", "30", "40", "50")}
    assert steps == {f"20261130T12{m}_10m" for m in ("20", "30", "40", "50")}
    hourly = {p.parent.name for p in (traces[60] / "telemetry").rglob("*.jsonl")}
    assert hourly == {"20261130T12"}


def test_cold_and_incremental_passes_judge_as_over_hourly_files(
    traces: dict[int, Path],
) -> None:
    settings = load_settings(environ={})
    hourly = analyze(traces[60], settings).to_dict()
    assert any(n["verdict"] != "healthy" for n in hourly["nodes"])  # there is something to see
    want = _verdicts(hourly)
    assert _verdicts(analyze(traces[10], settings).to_dict()) == want
    assert _verdicts(Analyzer(settings, traces[10]).analyze().to_dict()) == want
    at = START + 1200
    want_at = _verdicts(analyze(traces[60], settings, at).to_dict())
    assert _verdicts(analyze(traces[10], settings, at).to_dict()) == want_at
    assert _verdicts(Analyzer(settings, traces[10]).analyze(at).to_dict()) == want_at


# -- retention and the epilog -------------------------------------------------------------------


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}\n")
    return path


def test_retention_deletes_short_segments_by_their_own_end(tmp_path: Path) -> None:
    n1 = tmp_path / "telemetry" / "n1"
    gone = [_touch(n1 / f"20261206T1010_10m{s}") for s in (".cols", ".jsonl")]
    gone.append(_touch(tmp_path / "steps" / "7" / "n1.r0.20261206T0959_1m.jsonl"))
    gone.append(_touch(n1 / "20261206T09.jsonl"))
    kept = [
        _touch(n1 / "20261206T1020_10m.jsonl"),  # ends at 10:30, after the cutoff
        _touch(n1 / "20261206T10.jsonl"),  # the hour ends at 11:00
        _touch(n1 / "notes.jsonl"),  # not named by the layout: not ours to delete
        _touch(n1 / "20261206T1007_10m.jsonl"),
    ]
    report = store.prune(tmp_path, 3600, now=T10 + 1500 + 3600)
    assert sorted(report.files) == sorted(map(str, gone))
    assert all(p.exists() for p in kept) and not any(p.exists() for p in gone)


def test_the_epilog_reads_the_short_segments_of_the_jobs_last_hour(tmp_path: Path) -> None:
    now = time.time()
    for node, compute in (("node1", 1.0), ("node2", 1.0), ("node3", 1.5)):
        for ago in (3000.0, 1500.0, 30.0):  # three 10-minute files a node
            ts = now - ago
            rec = make_record("step", node, ts, job="42", rank=0, step_s=2.0, compute_s=compute)
            path = layout.node_telemetry_file(tmp_path, node, ts, 10)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as fh:
                fh.write(dumps(rec) + "\n")
        # before the job's last hour, a slow step of node1 that must not count
        rec = make_record("step", node, now - 7200, job="42", rank=0, step_s=9.0, compute_s=9.0)
        old = layout.node_telemetry_file(tmp_path, node, now - 7200, 10)
        old.parent.mkdir(parents=True, exist_ok=True)
        old.write_text(dumps(rec) + "\n")
        old.with_suffix(".cols").write_bytes(b"not records")  # a mirror is not read as records
    summary = straggler_summary(tmp_path, "42", ["node1", "node2", "node3"])
    assert summary == "job 42: straggler(s) node3; slowest node3 compute 1.5 s vs job median 1 s"


def test_a_job_named_like_a_segment_keeps_its_files_segments(tmp_path: Path) -> None:
    store.init(tmp_path)
    step = _touch(layout.step_file(tmp_path, "20261206T10", "n1", 0, T10 + 700, 10))
    node = _touch(layout.node_telemetry_file(tmp_path, "n1", T10 + 700, 10))
    groups = segment_groups(tmp_path, pick=lambda names: names)
    assert groups == {"20261206T1010_10m": sorted([str(node), str(step)])}
