"""Which exporter series give which schema-v1 field, and the conversions both ways.

dcgm-exporter names its series after DCGM fields (``DCGM_FI_DEV_SM_CLOCK``; types as in
its ``default-counters.csv``: gauges for clocks, power, temperature, utilisation, the
last XID and the clock-event bitmask; counters for PCIe replays, ECC, NVLink errors,
violation times and remapped rows). node_exporter's infiniband collector names its
series ``node_infiniband_*``. Each schema field lists the series that can give it, in
order of preference: the first one the server has is used, and a field none of them
gives is reported as missing, never filled in.

A few fields need more than a rename:

- ``xid``: the exporter's ``DCGM_FI_DEV_XID_ERRORS`` holds the *last* XID ever seen, the
  schema wants the XID of this interval: a sample carries an XID only where the value
  changed (the same XID twice in a row is seen once). Where no XID series exists, a
  rise of the remapped-row counter or a row-remap failure become XID 63 / 64, the
  XIDs NVIDIA's driver logs for the same events.
- ``clock_event_reasons``: the NVML bitmask where the exporter has it (renamed from
  ``CLOCK_THROTTLE_REASONS`` to ``CLOCKS_EVENT_REASONS`` in newer releases); else
  built from the violation counters: time spent in thermal violation since the last
  sample sets SW thermal slowdown (0x20), power violation the SW power cap (0x4).

:func:`exporter_series` is the inverse (what an exporter scraping every *scrape_s*
would have stored for some records): the benchmark and the tests use it to turn a
simulated fleet into exporter series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GAUGE, COUNTER = "gauge", "counter"

# NVML clock-event bits set from violation counters (see guardctl.analyze.features)
SW_POWER_CAP, SW_THERMAL = 0x4, 0x20
XID_ROW_REMAP, XID_ROW_REMAP_FAILURE = 63, 64
# node_exporter's state_id values (the numbers of the sysfs "4: ACTIVE" text)
IB_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


@dataclass(frozen=True)
class Series:
    """One exporter series that gives (part of) one schema field."""

    metric: str
    type: str  # GAUGE or COUNTER, as the exporter declares it
    scale: float = 1.0  # schema value = series value * scale
    how: str = "value"  # value | xid | remap_rows | remap_failure | thermal | power | state


def _s(metric: str, type_: str = GAUGE, scale: float = 1.0, how: str = "value") -> Series:
    return Series(metric, type_, scale, how)


# (kind, field) -> the series that can give it, best first
GPU_FIELDS: dict[str, tuple[Series, ...]] = {
    "sm_clock_mhz": (_s("DCGM_FI_DEV_SM_CLOCK"),),
    "power_w": (_s("DCGM_FI_DEV_POWER_USAGE"),),
    "power_limit_w": (
        _s("DCGM_FI_DEV_POWER_MGMT_LIMIT"),
        _s("DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
    ),
    "temp_c": (_s("DCGM_FI_DEV_GPU_TEMP"),),
    "util_pct": (
        _s("DCGM_FI_DEV_GPU_UTIL"),
        _s("DCGM_FI_PROF_GR_ENGINE_ACTIVE", scale=100.0),  # profiling field, a ratio
    ),
    "clock_event_reasons": (
        _s("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        _s("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
        _s("DCGM_FI_DEV_THERMAL_VIOLATION", COUNTER, how="thermal"),
        _s("DCGM_FI_DEV_POWER_VIOLATION", COUNTER, how="power"),
    ),
    "ecc_sbe_volatile": (_s("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", COUNTER),),
    "ecc_dbe_volatile": (_s("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", COUNTER),),
    "pcie_replay": (_s("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", COUNTER),),
    "nvlink_crc_errors": (_s("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", COUNTER),),
    "xid": (
        _s("DCGM_FI_DEV_XID_ERRORS", how="xid"),
        _s("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", COUNTER, how="remap_rows"),
        _s("DCGM_FI_DEV_ROW_REMAP_FAILURE", how="remap_failure"),
    ),
}
NIC_FIELDS: dict[str, tuple[Series, ...]] = {
    "state": (_s("node_infiniband_state_id", how="state"),),
    "rate_gbps": (_s("node_infiniband_rate_bytes_per_second", scale=8e-9),),
    "symbol_errors": (_s("node_infiniband_symbol_error_total", COUNTER),),
    "link_error_recovery": (_s("node_infiniband_link_error_recovery_total", COUNTER),),
    "link_downed": (_s("node_infiniband_link_downed_total", COUNTER),),
    "rcv_errors": (_s("node_infiniband_port_receive_errors_total", COUNTER),),
    "xmit_wait": (_s("node_infiniband_port_transmit_wait_total", COUNTER),),
    "xmit_bytes": (_s("node_infiniband_port_data_transmitted_bytes_total", COUNTER),),
}
FIELDS: dict[str, dict[str, tuple[Series, ...]]] = {"gpu": GPU_FIELDS, "nic": NIC_FIELDS}
# the schema's integer fields (the rest are floats)
INT_FIELDS = frozenset(
    {
        "clock_event_reasons",
        "ecc_sbe_volatile",
        "ecc_dbe_volatile",
        "pcie_replay",
        "nvlink_crc_errors",
        "xid",
        "symbol_errors",
        "link_error_recovery",
        "link_downed",
        "rcv_errors",
        "xmit_wait",
        "xmit_bytes",
    }
)
# guardctl's fields that no exporter series gives (the analyzer has them only from the agent)
NOT_EXPORTED = {"host": "cpu_pct, load1, mem_used_pct: guardctl's host collector only"}


def metric_names() -> list[str]:
    """Every exporter series this module reads."""
    return [s.metric for table in FIELDS.values() for opts in table.values() for s in opts]


def series_by_metric() -> dict[str, tuple[str, str, Series]]:
    """metric -> (kind, field, series)."""
    return {
        s.metric: (kind, name, s)
        for kind, table in FIELDS.items()
        for name, opts in table.items()
        for s in opts
    }


# --- series -> records ------------------------------------------------------------------------

Samples = list[tuple[float, float]]  # (ts, value), in time order
# (metric, sorted labels) -> samples: one exporter's series
SeriesSet = dict[tuple[str, tuple[tuple[str, str], ...]], Samples]


def field_values(series: Series, samples: Samples) -> list[tuple[float, Any]]:
    """The schema values one series gives, per sample (non-finite samples dropped)."""
    samples = [(t, v) for t, v in samples if math.isfinite(v)]
    if series.how == "value":
        return [(t, v * series.scale) for t, v in samples]
    if series.how == "state":
        return [(t, IB_STATES.get(int(v), str(int(v)))) for t, v in samples]
    if series.how in ("thermal", "power"):
        bit = SW_THERMAL if series.how == "thermal" else SW_POWER_CAP
        return [(t, bit if rose else 0) for t, rose in _rises(samples)]
    if series.how == "xid":
        return [(t, int(v) if changed and v > 0 else None) for t, v, changed in _changes(samples)]
    xid = XID_ROW_REMAP if series.how == "remap_rows" else XID_ROW_REMAP_FAILURE
    return [(t, xid if rose else None) for t, rose in _rises(samples)]


def _changes(samples: Samples) -> Iterable[tuple[float, float, bool]]:
    prev: float | None = None
    for t, v in samples:
        # the first sample's value may be old: only a change seen between samples is new
        yield t, v, prev is not None and v != prev
        prev = v


def _rises(samples: Samples) -> Iterable[tuple[float, bool]]:
    for t, v, changed in _changes(samples):
        yield t, changed and v > 0


def merge_fields(kind: str, name: str, values: list[list[tuple[float, Any]]]) -> dict[float, Any]:
    """One field's value per timestamp from its series (bitmask fields are or'ed)."""
    out: dict[float, Any] = {}
    for per_series in values:
        for t, v in per_series:
            if name == "clock_event_reasons" and t in out:
                out[t] = int(out[t]) | int(v)
            elif out.get(t) is None:
                out[t] = v
    if name in INT_FIELDS:
        return {t: (None if v is None else round(v)) for t, v in out.items()}
    return out


# --- records -> series (what an exporter would have scraped) ----------------------------------


def exporter_series(
    records: Iterable[Mapping[str, Any]], scrape_s: float, start: float, end: float
) -> SeriesSet:
    """The series an exporter scraping every *scrape_s* over [start, end] would hold.

    At each scrape the exporter reports each GPU's (port's) newest sample: gauges as
    they were then, counters as their cumulative value, the XID series as the last XID
    seen so far. Records between two scrapes that are not the newest are lost, as they
    are to a real exporter. Labels: ``Hostname`` and ``gpu`` (dcgm-exporter; and
    ``hpc_job`` for a GPU record that names its job), ``instance``, ``device`` and
    ``port`` (node_exporter).
    """
    by_unit: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "gpu":
            unit = ("gpu", str(r["node"]), str(r["gpu"]), str(r.get("job") or ""))
        elif r.get("kind") == "nic":
            unit = ("nic", str(r["node"]), f"{r['device']}:{r['port']}", "")
        else:
            continue
        by_unit.setdefault(unit, []).append(r)
    out: SeriesSet = {}
    scrapes = [start + i * scrape_s for i in range(int((end - start) // scrape_s) + 1)]
    for (kind, node, unit_name, job), recs in by_unit.items():
        recs.sort(key=lambda r: float(r["ts"]))
        labels = _labels(kind, node, unit_name) + ((("hpc_job", job),) if job else ())
        for metric, samples in _scrape(kind, recs, scrapes).items():
            out[(metric, labels)] = samples
    return out


def _labels(kind: str, node: str, unit: str) -> tuple[tuple[str, str], ...]:
    if kind == "gpu":
        return (("Hostname", node), ("gpu", unit))
    device, _, port = unit.rpartition(":")
    return (("device", device), ("instance", f"{node}:9100"), ("port", port))


def _scrape(kind: str, recs: list[Mapping[str, Any]], scrapes: list[float]) -> dict[str, Samples]:
    """Per metric: the value at each scrape of the newest record at or before it."""
    out: dict[str, Samples] = {}
    i, last_xid, newest = 0, 0, None
    for t in scrapes:
        while i < len(recs) and float(recs[i]["ts"]) <= t:
            newest = recs[i]
            if kind == "gpu" and recs[i].get("xid"):
                last_xid = int(recs[i]["xid"])
            i += 1
        if newest is None or t - float(newest["ts"]) > 300:  # Prometheus's staleness
            continue
        for name, opts in FIELDS[kind].items():
            first = opts[0]
            if name == "xid":
                out.setdefault(first.metric, []).append((t, float(last_xid)))
                continue
            value = newest.get(name)
            if value is None:
                continue
            if name == "state":
                code = next((k for k, v in IB_STATES.items() if v == str(value).upper()), 0)
                out.setdefault(first.metric, []).append((t, float(code)))
            else:
                out.setdefault(first.metric, []).append((t, float(value) / first.scale))
    return out
