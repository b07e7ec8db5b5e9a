"""The controller with ``[source] kind = "prometheus"``: a real Prometheus, the lab, guardctl as a
process.

Prometheus holds what dcgm-exporter and node_exporter would have scraped from one trace (backfilled,
ending now); the controller's store holds another trace's step and host records. A pass judges both
at once; a Prometheus that does not answer leaves the pass doing nothing, in one line.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controltools import Guardctl, control_guardctl, fleet_trace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sources"))

from promtools import PromServer, openmetrics, require_prometheus

from guardctl.sources.dcgm_fields import exporter_series
from guardctl.telemetry.schema import read_path

NODES = ["node1", "node2", "node3", "node4"]
SCRAPE_S = 10.0


def _source(url: str, **more: object) -> str:
    keys = {
        "kind": "prometheus",
        "url": url,
        "step_s": SCRAPE_S,
        "retries": 0,
        "timeout_s": 5.0,
        **more,
    }
    return "[source]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[PromServer]:
    """A Prometheus holding a trace whose node2 GPUs are in NVML's HW slowdown, ending now."""
    require_prometheus()
    trace = fleet_trace(tmp_path / "exported", NODES, hw_slowdown=["node2"])
    records = read_path(trace.root).records
    server = PromServer()
    try:
        server.backfill(openmetrics(exporter_series(records, SCRAPE_S, trace.t[0], trace.t[-1])))
        server.start()
        yield server
    finally:
        server.stop()


def _entries(g: Guardctl) -> list[dict[str, Any]]:
    return list(json.loads(g("history", "--json", "--limit", "1000").stdout)["entries"])


def _with_store(tmp_path: Path, lab: Any, url: str) -> Guardctl:
    """guardctl reading *url*; its store: step records with node3 slow, GPU records with node4
    in HW slowdown (not read: GPU telemetry comes from Prometheus)."""
    # two of four nodes at fault are node faults here, not a fleet-wide cause
    g = control_guardctl(
        tmp_path,
        lab,
        sections=_source(url),
        control="max_fleet_fraction = 0.6\nmax_job_fraction = 0.6\n",
    )
    fleet_trace(g.store, NODES, slow={"node3": 1.3}, hw_slowdown=["node4"])
    return g


def test_a_pass_judges_prometheus_series_and_the_stores_step_records(
    lab: Any, tmp_path: Path, exporter: PromServer
) -> None:
    g = _with_store(tmp_path, lab, exporter.url)
    proc = g("control", "--once", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["source"]["url"] == exporter.url
    given = report["source"]["given"]
    assert given["gpu.clock_event_reasons"] == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
    flagged = {f["node"]: f for f in report["findings"]}
    assert set(flagged) == {"node2", "node3"}, flagged  # node4's store GPU records: not read
    assert all(flagged[n]["kind"] == "persistent" for n in flagged)
    decided = {d["node"]: (d["decision"], d["outcome"]) for d in report["decisions"]}
    assert decided["node2"] == decided["node3"] == ("quarantine", "would do")
    assert "guardctl_" not in lab.sh("scontrol", "show", "reservation").stdout
    recorded = {e["nodes"][0] for e in _entries(g) if e["action"] == "control decision"}
    assert recorded == {"node2", "node3"}
    explained = json.loads(g("control", "--explain", "node2", "--json").stdout)
    assert explained["finding"]["kind"] == "persistent"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once closed


def test_prometheus_down_a_pass_does_nothing_and_says_so(lab: Any, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    g = _with_store(tmp_path, lab, url)  # the store alone would flag node3 and node4
    proc = g("control", "--once", "--json", "--act")
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"guardctl: error: {url}: cannot connect"), line
    assert not [e for e in _entries(g) if e["action"].startswith("control")]
    assert "guardctl_" not in lab.sh("scontrol", "show", "reservation").stdout
    # The daemon: one line a pass, and it goes on.
    daemon = g.popen("control", "--act", "--interval", "0.5")
    try:
        time.sleep(6)
        assert daemon.poll() is None, daemon.communicate()
        daemon.send_signal(signal.SIGTERM)
        _out, err = daemon.communicate(timeout=30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert daemon.returncode == 0, err
    lines = err.strip().splitlines()
    assert len(lines) >= 2 and "Traceback" not in err, err
    assert all(
        ln.startswith("guardctl: no analysis this pass, nothing decided or done")
        and "cannot connect" in ln
        for ln in lines
    ), err
    assert not [e for e in _entries(g) if e["action"].startswith("control")]
    assert "guardctl_" not in lab.sh("scontrol", "show", "reservation").stdout


def test_a_pass_reads_the_gpus_jobs_through_its_own_slurm(
    lab: Any, tmp_path: Path, exporter: PromServer
) -> None:
    g = control_guardctl(
        tmp_path,
        lab,
        sections=_source(exporter.url, jobs_from="slurm"),
        control="max_fleet_fraction = 0.6\nmax_job_fraction = 0.6\n",
    )
    fleet_trace(g.store, NODES, slow={"node3": 1.3})
    proc = g("control", "--once", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["source"]["jobs"]["from"] == "slurm"  # squeue answered: the pass went on
    assert {f["node"] for f in report["findings"]} == {"node2", "node3"}
    before = _entries(g)
    lab.stop_controller()
    try:
        proc = g("control", "--once", "--json")
    finally:
        lab.start_controller()
    assert proc.returncode == 7 and proc.stdout == "", proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith('guardctl: error: source.jobs_from = "slurm": cannot read'), line
    assert _entries(g) == before  # that pass decided and recorded nothing
