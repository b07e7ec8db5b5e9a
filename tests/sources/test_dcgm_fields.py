"""The field mapping by itself: conversions, node names, and the exporter rendering's round trip."""

from __future__ import annotations

import pytest

from guardctl.sections.source import SourceSettings
from guardctl.sources import dcgm_fields as F
from guardctl.sources.prometheus import NodeNames


def _series(metric: str) -> F.Series:
    return F.series_by_metric()[metric][2]


def test_an_xid_counts_where_the_last_xid_changes() -> None:
    samples = [(0.0, 79.0), (10.0, 79.0), (20.0, 48.0), (30.0, 48.0), (40.0, 0.0)]
    values = F.field_values(_series("DCGM_FI_DEV_XID_ERRORS"), samples)
    # the first sample's 79 may be days old; 48 is new at 20 s; a drop to 0 is no XID
    assert values == [(0.0, None), (10.0, None), (20.0, 48), (30.0, None), (40.0, None)]


def test_remapped_rows_and_remap_failure_become_their_xids() -> None:
    rows = F.field_values(_series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), [(0, 2), (10, 3)])
    failed = F.field_values(_series("DCGM_FI_DEV_ROW_REMAP_FAILURE"), [(0, 0), (10, 1)])
    assert rows == [(0, None), (10, 63)] and failed == [(0, None), (10, 64)]


def test_violation_counters_make_the_clock_event_bitmask() -> None:
    thermal = F.field_values(_series("DCGM_FI_DEV_THERMAL_VIOLATION"), [(0, 5), (10, 9), (20, 9)])
    power = F.field_values(_series("DCGM_FI_DEV_POWER_VIOLATION"), [(0, 1), (10, 2), (20, 2)])
    merged = F.merge_fields("gpu", "clock_event_reasons", [thermal, power])
    assert merged == {0: 0, 10: F.SW_THERMAL | F.SW_POWER_CAP, 20: 0}


def test_scales_and_states() -> None:
    util = F.field_values(_series("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), [(0, 0.5)])
    rate = F.field_values(_series("node_infiniband_rate_bytes_per_second"), [(0, 5e10)])
    state = F.field_values(_series("node_infiniband_state_id"), [(0, 4), (1, 1), (2, float("nan"))])
    assert util == [(0, 50.0)] and rate == [(0, pytest.approx(400.0))]
    assert state == [(0, "ACTIVE"), (1, "DOWN")]


@pytest.mark.parametrize(
    ("labels", "cfg", "want"),
    [
        ({"Hostname": "node1", "instance": "10.0.0.1:9400"}, {}, "node1"),
        ({"hostname": "node2", "instance": "10.0.0.2:9400"}, {}, "node2"),
        ({"instance": "node3:9100"}, {}, "node3"),
        ({"instance": "[fd00::3]:9100"}, {}, None),  # not a Slurm node name
        ({"instance": "10.0.0.4:9100"}, {"node_map": {"10.0.0.4": "node4"}}, "node4"),
        ({"instance": "gpu-a:9400"}, {"node_map": {"gpu-a:9400": "node5"}}, "node5"),
        ({"Hostname": "x", "kubernetes_node": "node6"}, {"node_label": "kubernetes_node"}, "node6"),
        ({"job": "dcgm"}, {}, None),
    ],
)
def test_node_names(labels: dict[str, str], cfg: dict[str, object], want: str | None) -> None:
    assert NodeNames(SourceSettings(**cfg))(labels) == want  # type: ignore[arg-type]


def test_an_exporter_keeps_only_the_newest_sample_per_scrape() -> None:
    recs = [
        {
            "kind": "gpu",
            "node": "n1",
            "gpu": 0,
            "ts": float(t),
            "sm_clock_mhz": 1000.0 + t,
            "xid": 79 if t == 12 else None,
        }
        for t in range(0, 30, 2)
    ]
    series = F.exporter_series(recs, 10.0, 0.0, 30.0)
    labels = (("Hostname", "n1"), ("gpu", "0"))
    assert series[("DCGM_FI_DEV_SM_CLOCK", labels)] == [
        (0, 1000),
        (10, 1010),
        (20, 1020),
        (30, 1028),
    ]
    # the XID at 12 s is held as "the last XID" from the next scrape on
    assert series[("DCGM_FI_DEV_XID_ERRORS", labels)] == [(0, 0), (10, 0), (20, 79), (30, 79)]


def test_every_series_read_is_named_once() -> None:
    names = F.metric_names()
    assert len(names) == len(set(names))
    assert all(n.startswith(("DCGM_FI_", "node_infiniband_")) for n in names)
