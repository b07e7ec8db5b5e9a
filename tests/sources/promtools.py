"""A real Prometheus server for tests: Debian's ``prometheus`` on loopback, its own data dir.

:func:`openmetrics` renders exporter series as OpenMetrics text;
:meth:`PromServer.start` backfills it into a fresh TSDB with
``promtool tsdb create-blocks-from openmetrics`` and starts the server on a free
port; :meth:`PromServer.stop` stops it and removes its files; :func:`require_prometheus` skips
a test where none can run (fails it under CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from guardctl.actionlog import Entry
from guardctl.export import StoreState
from guardctl.simulate import Truth

Series = Mapping[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]


def controller_state(at: float) -> StoreState:
    """What a store with one acting controller says at *at* (its last pass, a few log
    entries), for guardctl's controller metrics beside the fleet's series."""

    def entry(action: str, phase: str, **evidence: object) -> Entry:
        return Entry(f"e-{action}", at - 60, action, phase, ("node1",), evidence=evidence)

    return StoreState(
        passes=[
            {
                "host": "svc1",
                "ts": at - 30,
                "duration_s": 2.0,
                "interval_s": 60,
                "leader": True,
                "acting": True,
                "observe_only": False,
                "held_back": "",
                "refused": "",
                "error": "",
            }
        ],
        entries=[
            entry("quarantine", "done", by="control"),
            entry("control decision", "note", decision="quarantine", outcome="done"),
            entry("control sweep", "note", verdict="pass"),
            entry("control rehearsal", "note", step="quarantine"),
            entry("hook failed", "note", hook="prolog", drained=True),
            Entry(
                "e-fabric",
                at - 60,
                "control fabric",
                "note",
                ("node1", "node2"),
                evidence={
                    "component": "leaf:s1",
                    "kind": "leaf",
                    "phase": "open",
                    "confidence": 0.75,
                },
            ),
        ],
    )


def unavailable_reason() -> str | None:
    """Why no Prometheus can run here, or None."""
    missing = [b for b in ("prometheus", "promtool") if shutil.which(b) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian package 'prometheus')"
    return None


def require_prometheus() -> None:
    """Skip the test where no Prometheus can run, or fail it under CI=true."""
    import pytest

    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
        pytest.fail(f"CI=true but no Prometheus server can run here: {reason}", pytrace=False)
    pytest.skip(f"Prometheus unavailable: {reason}")


def openmetrics(series: Series) -> str:
    """OpenMetrics text of *series* (families contiguous, samples in time order)."""
    by_metric: dict[str, list[tuple[tuple[tuple[str, str], ...], list[tuple[float, float]]]]] = {}
    for (metric, labels), samples in series.items():
        by_metric.setdefault(metric, []).append((labels, samples))
    out = []
    for metric in sorted(by_metric):
        # Stored samples carry no type; "gauge" spares the _total naming rule of counters.
        out.append(f"# TYPE {metric} gauge")
        for labels, samples in by_metric[metric]:
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            for ts, value in samples:
                out.append(f"{metric}{{{text}}} {value!r} {ts:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PromServer:
    """One private Prometheus: started over backfilled data, stopped at the end."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="guardctl-prom-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def backfill(self, text: str) -> None:
        """Write *text* (OpenMetrics) into the TSDB as blocks, before :meth:`start`."""
        src = self.dir / "input.om"
        src.write_text(text)
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(src), str(data)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        src.unlink()

    def start(self) -> None:
        conf = self.dir / "prometheus.yml"
        conf.write_text("global:\n  scrape_interval: 30s\nscrape_configs: []\n")
        self.log = open(self.dir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={conf}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                "--storage.tsdb.retention.time=100y",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready after 60 s: {self.tail()}")

    def tail(self) -> str:
        path = self.dir / "prometheus.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def query(self, expr: str) -> dict[str, object]:
        body = urllib.parse.urlencode({"query": expr}).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query", data=body, timeout=10) as resp:
            doc: dict[str, object] = json.load(resp)
        return doc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None) is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# The session fleet's scrape interval (conftest.py's ``prom_fleet``), and what it yields.
SCRAPE_S = 10.0


@dataclass
class PromFleet:
    """The ``prom_fleet`` fixture: a simulated fleet in a store and in a Prometheus server.
    Here, not in conftest.py, so that test modules import it by a name that is theirs alone
    (``conftest`` is the name of every test folder's fixture file)."""

    server: PromServer
    store: Path
    truth: Truth
    start: float
    end: float

    @property
    def url(self) -> str:
        return self.server.url
