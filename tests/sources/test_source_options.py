"""Choosing a source: --from, [source], and their usage and configuration errors."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from guardctl.cli import main
from guardctl.simulate import simulate


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


def test_from_store_is_input(tmp_path: Path) -> None:
    simulate(tmp_path, nodes=8, duration=900, seed=3, faults="none")
    by_from = _run("analyze", "--from", "store", str(tmp_path), "--json")
    by_input = _run("analyze", "--input", str(tmp_path), "--json")
    assert by_from == by_input and by_from[0] == 0


def test_unknown_source_kind_is_a_usage_error() -> None:
    code, out = _run("analyze", "--from", "influx", "http://x")
    assert code == 2 and "--from: expected one of store, prometheus" in out


def test_from_store_with_input_is_a_usage_error(tmp_path: Path) -> None:
    code, out = _run("analyze", "--from", "store", str(tmp_path), "--input", str(tmp_path))
    assert code == 2 and "give one of them" in out


def test_not_a_url_is_an_input_error() -> None:
    code, out = _run("analyze", "--from", "prometheus", "prometheus:9090")
    assert code == 7 and "not an http(s) URL" in out


def test_prometheus_kind_needs_a_url() -> None:
    code, out = _run("--set", "source.kind=prometheus", "analyze")
    assert code == 3 and "url: needed" in out


def test_source_settings_are_checked() -> None:
    assert _run("--set", "source.max_points=20000", "analyze")[0] == 3
    assert _run("--set", 'source.store_kinds=["steps"]', "analyze")[0] == 3


def test_jobs_from_is_checked() -> None:
    code, out = _run("--set", "source.jobs_from=sacct", "analyze")
    assert code == 3 and "source.jobs_from" in out
