"""Reports (Markdown, HTML in a real headless browser) and the Prometheus textfile export."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from guardctl.analyze import analyze
from guardctl.cli import main
from guardctl.config import Settings
from guardctl.export import prometheus_text
from guardctl.simulate import simulate


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    root = tmp_path_factory.mktemp("fleet")
    truth = simulate(
        root, nodes=24, duration=1800, seed=21, faults="stuck_clocks,link_flaps,host_contention"
    )
    return root, {f.node for f in truth.faults}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clean")
    simulate(root, nodes=16, duration=1200, seed=22, faults="none")
    return root


def test_prometheus_file_is_accepted_by_a_real_parser(
    trace: tuple[Path, set[str]], tmp_path: Path
) -> None:
    root, faulty = trace
    out = tmp_path / "textfile" / "guardctl.prom"
    out.parent.mkdir()
    res = CliRunner().invoke(main, ["export", "--prometheus", str(out), "--input", str(root)])
    assert res.exit_code == 0, res.output
    assert os.listdir(out.parent) == ["guardctl.prom"]  # no temporary file left behind
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    families = {f.name: f for f in text_string_to_metric_families(out.read_text())}
    assert all(name.startswith("guardctl_") for name in families)
    assert families["guardctl_node_suspect"].type == "gauge"
    assert families["guardctl_node_suspect"].documentation
    suspect = {
        s.labels["node"] for s in families["guardctl_node_suspect"].samples if s.value == 1.0
    }
    assert suspect == faulty
    gpu = families["guardctl_gpu_finding_severity"].samples
    assert gpu and all({"node", "gpu", "detector"} <= set(s.labels) for s in gpu)
    counts = {s.labels["verdict"]: s.value for s in families["guardctl_analyze_nodes"].samples}
    assert counts["suspect"] == len(faulty) and sum(counts.values()) == 24


def test_prometheus_labels_are_escaped(trace: tuple[Path, set[str]]) -> None:
    result = analyze(trace[0], Settings())
    result.bad['odd "reason"\\\n'] = 2
    families = list(text_string_to_metric_families(prometheus_text(result)))
    bad = next(f for f in families if f.name == "guardctl_analyze_bad_lines")
    assert bad.samples[-1].labels["reason"] == 'odd "reason"\\\n'


def test_export_dry_run_prints_and_writes_nothing(
    trace: tuple[Path, set[str]], tmp_path: Path
) -> None:
    out = tmp_path / "g.prom"
    res = CliRunner().invoke(
        main, ["export", "--prometheus", str(out), "--input", str(trace[0]), "--dry-run"]
    )
    assert res.exit_code == 0 and "# TYPE guardctl_node_suspect gauge" in res.output
    assert not out.exists()
    res = CliRunner().invoke(
        main, ["export", "--prometheus", str(tmp_path / "no" / "g.prom"), "--input", str(trace[0])]
    )
    assert res.exit_code == 8 and "cannot write" in res.output


def test_markdown_report_and_exit_codes(
    trace: tuple[Path, set[str]], clean: Path, tmp_path: Path
) -> None:
    root, faulty = trace
    runner = CliRunner()
    res = runner.invoke(main, ["report", "--input", str(root), "--period", "30m"])
    assert res.exit_code == 1, res.output
    text = res.output
    assert text.startswith("# guardctl fleet health report")
    act = text.split("## Act on these")[1].split("## ")[0]
    assert {n for n in faulty if n in act} == faulty
    res = runner.invoke(
        main,
        ["report", "--input", str(clean), "--period", "20m", "--output", str(tmp_path / "r.md")],
    )
    assert res.exit_code == 0, res.output
    assert "Suspect now**: 0" in (tmp_path / "r.md").read_text()
    res = runner.invoke(main, ["report", "--input", str(clean), "--period", "soon"])
    assert res.exit_code == 2


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_html_report_renders_in_a_headless_browser(
    trace: tuple[Path, set[str]], tmp_path: Path
) -> None:
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is required in CI (apt-get install -y chromium)")
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    root, faulty = trace
    page = tmp_path / "report.html"
    res = CliRunner().invoke(
        main,
        [
            "report",
            "--input",
            str(root),
            "--period",
            "30m",
            "--format",
            "html",
            "--output",
            str(page),
        ],
    )
    assert res.exit_code == 1, res.output
    html = page.read_text()
    assert "http://" not in html and "https://" not in html  # self-contained
    profile = tmp_path / "profile"
    run = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    assert 'id="plot-deviation"' in dom and 'id="plot-heatmap"' in dom
    assert re.search(r'data-plots-loaded="2"', dom), "plots did not decode in the browser"
    for node in faulty:
        assert node in dom


def test_json_report_for_scripts(trace: tuple[Path, set[str]]) -> None:
    import json

    root, faulty = trace
    res = CliRunner().invoke(main, ["report", "--input", str(root), "--period", "30m", "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    assert set(doc["suspect_now"]) == faulty
    assert set(doc["ever_suspect"]) >= faulty
    assert doc["passes"] == 6 and doc["latest"]["schema"] == 1


def test_report_period_longer_than_the_data(trace: tuple[Path, set[str]]) -> None:
    # The default period (24h) reaches far before a 30-minute store: the early passes have no
    # data at all and must count as empty, not crash.
    import json

    root, faulty = trace
    res = CliRunner().invoke(main, ["report", "--input", str(root), "--period", "24h", "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.output)
    assert set(doc["suspect_now"]) == faulty
