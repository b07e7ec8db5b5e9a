"""Fixtures of the Prometheus-source tests: one simulated fleet, in the store and in Prometheus.

``prom_fleet`` (session): a 12-node, 2-hour simulated fleet with faults, written to a
store, rendered as the series dcgm-exporter and node_exporter would have scraped every
10 s (plus guardctl's own exported metrics every 5 minutes), backfilled into a private
Prometheus server (Debian's ``prometheus``, loopback, free port, temp data dir) that
is stopped at the end. Where Prometheus is not installed the tests are skipped, except
under CI=true, where they fail (as the Slurm lab's are).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from promtools import (
    SCRAPE_S,
    PromFleet,
    PromServer,
    controller_state,
    openmetrics,
    require_prometheus,
)

from guardctl.analyze import analyze_frame, history_needed, load
from guardctl.analyze.frame import select
from guardctl.config import Settings
from guardctl.export import Export, prometheus_text
from guardctl.simulate import simulate
from guardctl.sources.dcgm_fields import exporter_series
from guardctl.telemetry.schema import read_path

DURATION = 7200.0
FAULTS = "thermal,stuck_clocks,link_errors,link_flaps,slow_gpu"


def _guardctl_series(store: Path, start: float, end: float) -> dict:  # type: ignore[type-arg]
    """guardctl's exported metrics every 5 minutes of the last half hour, as series."""
    settings = Settings()
    frame = load(store, settings)
    span = history_needed(settings.analyze)
    out: dict = {}  # type: ignore[type-arg]
    for at in range(int(end - 1800), int(end) + 1, 300):
        result = analyze_frame(select(frame, at - span, at), settings.analyze, at=float(at))
        export = Export(result, store=controller_state(float(at)))
        for family in text_string_to_metric_families(prometheus_text(export)):
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                out.setdefault(key, []).append((float(at), float(s.value)))
    return out


@pytest.fixture(scope="session")
def prom_fleet() -> Iterator[PromFleet]:
    require_prometheus()
    tmp = Path(tempfile.mkdtemp(prefix="guardctl-promfleet-"))
    # Recent enough that "the last hours" queries work, old enough to be whole blocks.
    end = float(int(time.time()) // 600 * 600 - 1800)
    start = end - DURATION
    store = tmp / "store"
    truth = simulate(store, nodes=12, duration=DURATION, seed=5, faults=FAULTS, start=start)
    records = read_path(store).records
    series = exporter_series(records, SCRAPE_S, start, end)
    series.update(_guardctl_series(store, start, end))
    server = PromServer()
    try:
        server.backfill(openmetrics(series))
        server.start()
        yield PromFleet(server, store, truth, start, end)
    finally:
        server.stop()
