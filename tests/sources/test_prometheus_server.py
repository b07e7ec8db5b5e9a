"""Analysis through a real Prometheus server's HTTP API against the same fleet's own store.

The fleet (see conftest.py) is in both places: the store as the agent and the probe
wrote it, Prometheus as dcgm-exporter and node_exporter would have scraped it. Verdicts
must agree; a server that fails in any way must give a one-line error and exit 7.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from promtools import SCRAPE_S, PromFleet

from guardctl.analyze import analyze
from guardctl.cli import main
from guardctl.config import Settings
from guardctl.errors import SourceError
from guardctl.report import make_report
from guardctl.sections.source import SourceSettings
from guardctl.sources import analyze_source, open_source

BUSY_ONLY = {"busy_time", "host_contention"}  # what needs the store's step and host records


def _settings(**source: object) -> Settings:
    base = {"step_s": SCRAPE_S, "retries": 0, "timeout_s": 5.0}
    base.update(source)
    return dataclasses.replace(Settings(), source=SourceSettings(**base))  # type: ignore[arg-type]


def _suspects(result: object) -> set[str]:
    return {n.node for n in result.suspects}  # type: ignore[attr-defined]


def test_mixed_source_finds_the_same_suspects_as_the_store(prom_fleet: PromFleet) -> None:
    settings = _settings()
    own = analyze(prom_fleet.store, settings, prom_fleet.end)
    source = open_source(settings, ("prometheus", prom_fleet.url), prom_fleet.store)
    mixed = analyze_source(source, prom_fleet.end)
    assert _suspects(own) == {f.node for f in prom_fleet.truth.faults}
    assert _suspects(mixed) == _suspects(own)
    assert {n.node: n.verdict for n in mixed.nodes} == {n.node: n.verdict for n in own.nodes}
    assert source.coverage is not None and not source.coverage.missing
    assert source.coverage.given["gpu.sm_clock_mhz"] == "DCGM_FI_DEV_SM_CLOCK"


def test_prometheus_alone_finds_every_telemetry_fault(prom_fleet: PromFleet) -> None:
    settings = _settings(store_kinds=())
    result = analyze_source(
        open_source(settings, ("prometheus", prom_fleet.url), None), prom_fleet.end
    )
    # busy time needs the probe: the slow-in-busy-time GPU is invisible to the exporter
    wanted = {f.node for f in prom_fleet.truth.faults if f.kind != "slow_gpu"}
    assert _suspects(result) == wanted
    for n in result.suspects:
        assert not {e.detector for e in n.evidence} & BUSY_ONLY


def test_cli_json_says_what_the_source_gave(prom_fleet: PromFleet) -> None:
    res = CliRunner().invoke(
        main,
        [
            "--set",
            f"source.step_s={SCRAPE_S}",
            "--set",
            'source.selector="Hostname=~\\".+\\""',  # dcgm-exporter only: no NIC series
            "analyze",
            "--from",
            "prometheus",
            prom_fleet.url,
            "--input",
            str(prom_fleet.store),
            "--at",
            str(prom_fleet.end),
            "--json",
        ],
    )
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    assert doc["source"]["kind"] == "prometheus"
    assert "gpu.temp_c" in doc["source"]["given"]
    assert doc["source"]["missing"]["nic.rate_gbps"] == "no node_infiniband_rate_bytes_per_second"
    nodes = {n["node"]: n for n in doc["nodes"]}
    thermal = next(f.node for f in prom_fleet.truth.faults if f.kind == "thermal")
    assert nodes[thermal]["verdict"] == "suspect"


def test_report_over_prometheus_matches_the_store(prom_fleet: PromFleet) -> None:
    settings = _settings()
    source = open_source(settings, ("prometheus", prom_fleet.url), prom_fleet.store)
    kw = {"period_s": 3600.0, "fmt": "json", "end": prom_fleet.end}
    own = make_report(prom_fleet.store, settings, **kw)  # type: ignore[arg-type]
    via = make_report(None, settings, source=source, **kw)  # type: ignore[arg-type]
    a, b = json.loads(own.text), json.loads(via.text)
    assert b["source"] == prom_fleet.url
    assert (
        a["suspect_now"] == b["suspect_now"]
        and a["ever_suspect"].keys() == b["ever_suspect"].keys()
    )


def test_queries_are_chunked_to_max_points(prom_fleet: PromFleet) -> None:
    settings = _settings(store_kinds=(), max_points=10)
    source = open_source(settings, ("prometheus", prom_fleet.url), None)
    chunked = analyze_source(source, prom_fleet.end)
    assert source.coverage is not None
    # a pass spans 3 windows of 300 s: 91 steps of 10 s, 10 queries of up to 10 steps per
    # series, and per record kind (gpu, nic) for the sample times
    assert source.coverage.queries == 10 * (len(source.coverage.given) + 2)
    whole = analyze_source(
        open_source(_settings(store_kinds=()), ("prometheus", prom_fleet.url), None), prom_fleet.end
    )
    assert chunked.to_dict()["nodes"] == whole.to_dict()["nodes"]


# --- a source that fails: an error, never a verdict -----------------------------------------


def _run(url: str, *extra: str) -> tuple[int, str]:
    res = CliRunner().invoke(
        main,
        [
            "--set",
            "source.retries=1",
            "--set",
            "source.retry_backoff_s=0.05",
            "--set",
            "source.timeout_s=1",
            *extra,
            "analyze",
            "--from",
            "prometheus",
            url,
            "--at",
            "1700000000",
        ],
    )
    return res.exit_code, res.output


def _assert_one_line_error(code: int, output: str, *words: str) -> None:
    assert code == 7, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("guardctl: error: "), output
    for word in words:
        assert word in lines[0], output


def test_prometheus_down() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    code, out = _run(f"http://127.0.0.1:{port}")
    _assert_one_line_error(code, out, "cannot connect", "2 tries")


def test_prometheus_too_slow() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)  # accepts connections (the kernel does) and never answers
        code, out = _run(f"http://127.0.0.1:{s.getsockname()[1]}")
    _assert_one_line_error(code, out, "no answer within 1 s")


def test_prometheus_query_error(prom_fleet: PromFleet) -> None:
    code, out = _run(prom_fleet.url, "--set", 'source.selector="Hostname=~\\"(\\""')
    _assert_one_line_error(code, out, "bad_data")


def test_prometheus_without_the_series(prom_fleet: PromFleet) -> None:
    code, out = _run(prom_fleet.url, "--set", 'source.selector="Hostname=\\"nosuchnode\\""')
    _assert_one_line_error(code, out, "no dcgm-exporter or node_exporter series")


class _Canned(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b""
    calls = 0

    def do_POST(self) -> None:  # the http.server API names it
        type(self).calls += 1
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[tuple[type[_Canned], str]]:
    handler = type("Handler", (_Canned,), {"calls": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_partial_result_is_refused(canned: tuple[type[_Canned], str]) -> None:
    handler, url = canned
    handler.body = json.dumps(
        {
            "status": "success",
            "warnings": ["remote read of store-2 failed"],
            "data": {"resultType": "matrix", "result": []},
        }
    ).encode()
    code, out = _run(url)
    _assert_one_line_error(code, out, "partial result", "store-2")


def test_unavailable_is_retried_then_an_error(canned: tuple[type[_Canned], str]) -> None:
    handler, url = canned
    handler.status, handler.body = 503, b"overloaded"
    code, out = _run(url)
    _assert_one_line_error(code, out, "HTTP 503", "2 tries")
    assert handler.calls == 2


def test_not_prometheus_json(canned: tuple[type[_Canned], str]) -> None:
    handler, url = canned
    handler.body = b"<html>login</html>"
    code, out = _run(url)
    _assert_one_line_error(code, out, "not Prometheus's JSON")


def test_bearer_token_is_sent(canned: tuple[type[_Canned], str], tmp_path: Path) -> None:
    handler, url = canned
    seen: list[str] = []

    def do_post(self: _Canned) -> None:
        seen.append(self.headers.get("Authorization", ""))
        _Canned.do_POST(self)

    handler.do_POST = do_post  # type: ignore[method-assign]
    handler.body = json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": []}}
    ).encode()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    code, out = _run(url, "--set", f'source.bearer_token_file="{token}"')
    _assert_one_line_error(code, out, "no dcgm-exporter")
    assert seen and set(seen) == {"Bearer s3cret"}


def test_missing_token_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot read"):
        settings = _settings(bearer_token_file=str(tmp_path / "absent"))
        analyze_source(open_source(settings, ("prometheus", "http://127.0.0.1:1"), None), 1e9)


def test_a_step_finer_than_the_scrape_repeats_no_sample(prom_fleet: PromFleet) -> None:
    # At a 5 s step every other step finds the same 10 s sample (Prometheus's lookback):
    # those are dropped, so the records, and the verdicts, are the scrape's own.
    fine = open_source(_settings(store_kinds=(), step_s=5.0), ("prometheus", prom_fleet.url), None)
    coarse = open_source(_settings(store_kinds=()), ("prometheus", prom_fleet.url), None)
    since, until = prom_fleet.end - 900, prom_fleet.end
    a, b = fine.load(since, until), coarse.load(since, until)
    assert a.count("gpu") == b.count("gpu") and a.count("nic") == b.count("nic")
    ra, rb = analyze_source(fine, prom_fleet.end), analyze_source(coarse, prom_fleet.end)
    assert {n.node: n.verdict for n in ra.nodes} == {n.node: n.verdict for n in rb.nodes}


def test_export_writes_nothing_without_fresh_series(prom_fleet: PromFleet, tmp_path: Path) -> None:
    # The fleet's series end half an hour ago: the last 15 minutes hold none.
    out = tmp_path / "guardctl.prom"
    res = CliRunner().invoke(
        main, ["export", "--from", "prometheus", prom_fleet.url, "--prometheus", str(out)]
    )
    _assert_one_line_error(res.exit_code, res.output, "no dcgm-exporter or node_exporter series")
    assert not out.exists()
