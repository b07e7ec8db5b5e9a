"""The Grafana dashboard in contrib/: well-formed, and every query valid on a real Prometheus.

Each panel's PromQL goes to the server's /api/v1/query (a syntax or type error is an
HTTP 400); every metric it names must be one guardctl exports or one of the exporter
series guardctl reads, and must be there in the backfilled fleet.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from promtools import PromFleet, controller_state

from guardctl.analyze import analyze
from guardctl.config import Settings
from guardctl.export import Export, prometheus_text
from guardctl.sources.dcgm_fields import metric_names
from guardctl.sources.prometheus import PrometheusClient

DASHBOARD = Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "guardctl-fleet.json"
METRIC = re.compile(r"\b(guardctl_\w+|DCGM_FI_\w+|node_\w+)\b")
# what Grafana puts in before it sends a query
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "30s", "$node": ".*"}


def _dashboard() -> dict:  # type: ignore[type-arg]
    return json.loads(DASHBOARD.read_text())


def _exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _dashboard()["panels"] for t in p["targets"]]


def _expand(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def test_dashboard_is_well_formed() -> None:
    dash = _dashboard()
    variables = {v["name"] for v in dash["templating"]["list"]}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] and dash["title"]
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        assert p["type"] in {"stat", "timeseries", "table"}, p["title"]
        assert p["datasource"]["uid"].strip("${}") in variables
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        for t in p["targets"]:
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var in variables or f"${var}" in GRAFANA_VARS, (p["title"], var)


def test_dashboard_names_only_metrics_that_exist(prom_fleet: PromFleet) -> None:
    result = analyze(prom_fleet.store, Settings(), prom_fleet.end)
    text = prometheus_text(Export(result, store=controller_state(prom_fleet.end)))
    families = list(text_string_to_metric_families(text))
    exported = {f.name for f in families} | {s.name for f in families for s in f.samples}
    # a family without samples in a healthy pass (bad input lines): declared, never stored
    unsampled = {f.name for f in families if not f.samples}
    known = exported | set(metric_names())
    client = PrometheusClient(prom_fleet.url, Settings().source)
    named: set[str] = set()
    for title, expr in _exprs():
        found = set(METRIC.findall(expr))
        assert found, title
        assert found <= known, f"{title}: {sorted(found - known)} neither exported nor read"
        named |= found
    for name in sorted(named - unsampled):
        data = client.query(f"count(last_over_time({name}[3h]))", prom_fleet.end)
        assert data["result"], f"{name}: not in the fleet's series"


@pytest.mark.parametrize(("title", "expr"), _exprs())
def test_every_query_is_valid_promql(prom_fleet: PromFleet, title: str, expr: str) -> None:
    client = PrometheusClient(prom_fleet.url, Settings().source)
    data = client.query(_expand(expr), prom_fleet.end)  # raises on a 400 (bad_data)
    assert data["resultType"] in {"vector", "scalar"}, title
