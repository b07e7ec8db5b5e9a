"""Every telemetry source offers the same to its callers (:class:`guardctl.storage.source.Source`),
and ``open_source`` hands out the one the settings and ``--from`` name."""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from guardctl.analyze import analyze, history_needed, load, steps_needed
from guardctl.analyze.frame import Frame
from guardctl.config import Settings
from guardctl.errors import SourceError, UsageError
from guardctl.sections.source import SourceSettings
from guardctl.sources import MixedSource, PrometheusSource, open_source
from guardctl.storage import layout
from guardctl.storage.source import Source, StoreSource
from guardctl.storage.writer import LineWriter
from guardctl.telemetry.schema import dumps, make_record

T0 = 1_796_000_400.0  # on the hour: the records below fill the two hours after it
NODES = ("gn01", "gn02")


def _settings(root: Path, **source: object) -> Settings:
    cfg = SourceSettings(step_s=60.0, retries=0, timeout_s=5.0, **source)  # type: ignore[arg-type]
    settings = Settings()
    store = dataclasses.replace(settings.store, root=root)
    return dataclasses.replace(settings, source=cfg, store=store)


def _write_store(root: Path) -> None:
    """Two hours of GPU records from the agents and step records from a probe without one."""
    lines: dict[Path, list[str]] = {}
    for i in range(240):
        ts = T0 + 30.0 * i
        for rank, node in enumerate(NODES):
            gpu = make_record("gpu", node, ts, gpu=0, sm_clock_mhz=1400.0 + i % 7, power_w=300.0)
            lines.setdefault(layout.node_telemetry_file(root, node, ts), []).append(dumps(gpu))
            step = make_record("step", node, ts, job="7", rank=rank, step_s=1.5)
            lines.setdefault(layout.step_file(root, "7", node, rank, ts), []).append(dumps(step))
    writer = LineWriter()
    for path, batch in lines.items():  # one durable batch per file, as the agent writes
        writer.append(path, "".join(line + "\n" for line in batch).encode())
    writer.close()


def _same(a: Frame, b: Frame) -> None:
    assert (a.nodes, a.jobs, a.files, a.records, dict(a.bad)) == (
        b.nodes,
        b.jobs,
        b.files,
        b.records,
        dict(b.bad),
    )
    assert a.cols.keys() == b.cols.keys()
    for kind, cols in a.cols.items():
        assert cols.keys() == b.cols[kind].keys()
        for name, col in cols.items():
            assert np.array_equal(col, b.cols[kind][name], equal_nan=col.dtype.kind == "f")


class _EmptyPrometheus(http.server.BaseHTTPRequestHandler):
    """A Prometheus with no series at all: every range query answers an empty matrix."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": []}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EmptyPrometheus)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    _write_store(root)
    return root


def _what_a_caller_sees(source: Source) -> tuple[str, str, float]:
    # Typed to take the protocol: mypy checks each implementation handed to it.
    return source.kind, source.describe(), source.span()


def test_every_implementation_is_a_source(store: Path) -> None:
    settings = _settings(store)
    url = "http://prometheus.example:9090"
    sources: list[Source] = [
        StoreSource(settings),
        PrometheusSource(settings, url),
        MixedSource(settings, url, store),
    ]
    seen = [_what_a_caller_sees(s) for s in sources]
    assert [k for k, _, _ in seen] == ["store", "prometheus", "mixed"]
    assert [d for _, d, _ in seen] == [str(store), url, url]
    # the store reads the ranks' own history too; Prometheus only the judged windows
    judged = history_needed(settings.analyze)
    assert [s for _, _, s in seen] == [steps_needed(settings.analyze), judged, judged]
    assert judged < steps_needed(settings.analyze)
    for source in sources:
        assert source.coverage is None  # nothing read yet (the store: never any)
        for member in ("settings", "load", "recent", "frame", "analyze", "newest"):
            assert hasattr(source, member), (type(source).__name__, member)


def test_the_store_source_reads_what_the_analyzer_reads(store: Path) -> None:
    settings = _settings(store)
    source = StoreSource(settings)
    whole = source.load(None, None)
    assert whole.records == 4 * 240 and whole.files == len(list(store.rglob("*.jsonl"))) > 4
    _same(whole, load(None, settings))
    since, until = T0 + 1800.0, T0 + 5400.0
    _same(source.load(since, until), load(store, settings, since=since, until=until))
    at = T0 + 3600.0
    span = steps_needed(settings.analyze)
    _same(source.frame(at), load(store, settings, since=at - span, until=at))
    assert source.analyze(at).to_dict() == analyze(store, settings, at).to_dict()
    assert source.coverage is None


def test_the_store_source_reads_a_path_given(store: Path, tmp_path: Path) -> None:
    source = StoreSource(_settings(tmp_path / "elsewhere"), store)
    assert source.describe() == str(store)
    _same(source.load(None, None), load(store, source.settings))


def test_open_source_picks_the_store_prometheus_or_both(store: Path, tmp_path: Path) -> None:
    url = "http://prometheus.example:9090"
    plain = _settings(store)
    assert open_source(plain, None, None).kind == "store"
    assert open_source(plain, None, None).describe() == str(store)
    given = open_source(plain, ("store", str(tmp_path)), None)
    assert (given.kind, given.describe()) == ("store", str(tmp_path))
    assert open_source(plain, None, tmp_path).describe() == str(tmp_path)
    configured = _settings(store, kind="prometheus", url=url)
    assert (
        open_source(configured, None, None).kind,
        open_source(configured, None, None).describe(),
    ) == ("mixed", url)
    alone = _settings(store, kind="prometheus", url=url, store_kinds=())
    assert open_source(alone, None, None).kind == "prometheus"
    assert open_source(plain, ("prometheus", url), None).kind == "mixed"
    assert open_source(_settings(store, store_kinds=()), ("prometheus", url), None).kind == (
        "prometheus"
    )


def test_open_source_refuses_what_it_cannot_read(store: Path) -> None:
    with pytest.raises(UsageError, match=r"^--from: expected one of store, prometheus, got 'x'$"):
        open_source(_settings(store), ("x", "y"), None)
    with pytest.raises(UsageError, match=r"^--from store PATH and --input PATH: give one of them$"):
        open_source(_settings(store), ("store", str(store)), store)
    with pytest.raises(UsageError, match=r"^a Prometheus source needs a time range$"):
        open_source(_settings(store), ("prometheus", "http://p:9090"), None).load(None, T0)


def test_mixed_adds_the_store_kinds_and_counts_them(store: Path, prometheus: str) -> None:
    settings = _settings(store)
    since, until = T0, T0 + 7200.0
    mixed = open_source(settings, ("prometheus", prometheus), store)
    frame = mixed.load(since, until)
    # the store's step and host records only: Prometheus gives the GPUs
    assert frame.count("step") == 2 * 240 and frame.count("gpu") == 0
    assert mixed.coverage is not None
    cov = mixed.coverage.to_dict()
    assert cov["store"] == {
        "path": str(store),
        "kinds": ["step", "host"],
        "files": len(list(store.rglob("*.jsonl"))),  # every segment of the two hours
        "records": 480,
    }
    assert cov["series"] == 0 and cov["url"] == prometheus
    assert mixed.coverage.store_warning() is None


def test_prometheus_alone_reads_no_store(store: Path, prometheus: str) -> None:
    source = open_source(_settings(store, store_kinds=()), ("prometheus", prometheus), store)
    frame = source.load(T0, T0 + 7200.0)
    assert frame.records == 0 and frame.files == 0
    assert source.coverage is not None and source.coverage.to_dict()["store"] == {}


def test_mixed_says_when_the_store_has_none_of_its_kinds(tmp_path: Path, prometheus: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    source = open_source(_settings(tmp_path), ("prometheus", prometheus), empty)
    assert source.load(T0, T0 + 60.0).records == 0
    assert source.coverage is not None
    warning = source.coverage.store_warning()
    assert warning is not None and warning.startswith(
        f"no step/host records (source.store_kinds) in {empty}"
    )


@pytest.mark.parametrize("store_kinds", [(), ("step", "host")])
def test_a_pass_on_prometheus_without_series_is_refused(
    store: Path, prometheus: str, store_kinds: tuple[str, ...]
) -> None:
    source = open_source(
        _settings(store, store_kinds=store_kinds), ("prometheus", prometheus), store
    )
    span = source.span()
    refusal = f"no dcgm-exporter or node_exporter series in the {span:g} s before {T0}"
    with pytest.raises(SourceError, match=re.escape(refusal) + "$"):
        source.analyze(T0)
    with pytest.raises(SourceError, match=r"series in the .* before now$"):
        source.frame()
