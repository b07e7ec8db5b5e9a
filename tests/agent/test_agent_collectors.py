"""Collectors on recorded sysfs trees, a fake NVML, and the real host."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from agent_helpers import SYSFS_IB2, SYSFS_IB8, FakeNvml, settings

from guardctl import collectors
from guardctl.collectors import CollectorUnavailable
from guardctl.collectors.infiniband import InfinibandCollector, parse_rate_gbps, parse_state
from guardctl.collectors.nvml import NvmlCollector
from guardctl.errors import ConfigError
from guardctl.telemetry.schema import validate


def test_registry_has_one_plugin_per_file() -> None:
    assert collectors.names() == ["host", "infiniband", "nvml"]
    with pytest.raises(ConfigError, match="unknown collector 'dcgm'"):
        collectors.create("dcgm", settings())


# -- infiniband ------------------------------------------------------------------


def test_infiniband_reads_state_rate_and_counters() -> None:
    records = InfinibandCollector(SYSFS_IB2).collect("node7", 100.0)
    assert [(r["device"], r["port"]) for r in records] == [("mlx5_0", 1), ("mlx5_1", 1)]
    good, grey = records
    assert good["state"] == "ACTIVE" and good["rate_gbps"] == 400.0
    assert grey["rate_gbps"] == 200.0  # trained down to HDR
    errors = (grey["symbol_errors"], grey["link_error_recovery"], grey["link_downed"])
    assert errors == (1187, 14, 3)
    assert grey["rcv_errors"] == 92 and grey["xmit_wait"] == 2_911_004_557
    # port_xmit_data counts 4-byte words
    words = int((SYSFS_IB2 / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").read_text())
    assert good["xmit_bytes"] == 4 * words and good["rcv_bytes"] % 4 == 0
    for record in records:
        assert validate(record) is record and record["node"] == "node7"


def test_infiniband_eight_ports() -> None:
    records = InfinibandCollector(SYSFS_IB8).collect("n", 1.0)
    assert [r["device"] for r in records] == [f"mlx5_{i}" for i in range(8)]


def test_missing_counter_is_left_out_and_down_port_reported(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(SYSFS_IB2, root)
    port = root / "class/infiniband/mlx5_1/ports/1"
    (port / "counters/port_xmit_wait").unlink()  # some HCAs/firmware lack it
    (port / "state").write_text("1: DOWN\n")
    (port / "rate").write_text("garbage\n")
    record = InfinibandCollector(root).collect("n", 1.0)[1]
    assert record["state"] == "DOWN"
    assert "xmit_wait" not in record and "rate_gbps" not in record
    assert record["symbol_errors"] == 1187


def test_no_infiniband_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(CollectorUnavailable, match="no InfiniBand"):
        InfinibandCollector(tmp_path).collect("n", 1.0)


@pytest.mark.parametrize(
    ("text", "state"), [("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("ACTIVE", "ACTIVE")]
)
def test_parse_state(text: str, state: str) -> None:
    assert parse_state(text) == state


def test_parse_rate() -> None:
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate_gbps("25 Gb/sec (1X EDR)") == 25.0
    assert parse_rate_gbps("") is None and parse_rate_gbps("n/a") is None


# -- nvml ------------------------------------------------------------------------


def test_nvml_reads_every_gpu(fake_nvml: FakeNvml) -> None:
    records = NvmlCollector().collect("gpu01", 5.0)
    assert [r["gpu"] for r in records] == list(range(8))
    healthy, grey = records[0], records[5]
    assert healthy["sm_clock_mhz"] == 1980 and healthy["power_w"] == 652.0
    assert healthy["power_limit_w"] == 700.0 and healthy["util_pct"] == 100
    assert healthy["clock_event_reasons"] == 0 and healthy["xid"] is None
    assert healthy["row_remap_pending"] is False and healthy["nvlink_crc_errors"] == 0
    assert grey["clock_event_reasons"] == 0x48 and grey["temp_c"] == 87
    assert grey["ecc_sbe_volatile"] == 12 and grey["pcie_replay"] == 3
    assert grey["nvlink_crc_errors"] == 41 and grey["row_remap_pending"] is True
    assert all(validate(r) is r for r in records)


def test_nvml_xid_events_last_one_per_interval(fake_nvml: FakeNvml) -> None:
    collector = NvmlCollector()
    collector.collect("n", 1.0)
    fake_nvml.inject_xid(2, 48)
    fake_nvml.inject_xid(2, 79)
    fake_nvml.inject_xid(6, 94)
    xids = [r["xid"] for r in collector.collect("n", 2.0)]
    assert xids == [None, None, 79, None, None, None, 94, None]
    assert [r["xid"] for r in collector.collect("n", 3.0)] == [None] * 8  # drained


def test_older_gpu_lacks_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml("v100_sxm2_2gpu.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    collector = NvmlCollector()
    first = collector.collect("v", 1.0)
    assert all("row_remap_pending" not in r for r in first)  # NotSupported: left out
    assert first[0]["nvlink_crc_errors"] == 6  # flit + data, summed over links
    calls = fake.calls
    collector.collect("v", 2.0)
    per_sample = fake.calls - calls
    # NotSupported is not asked again: 2 GPUs x (9 one-call fields + 6 links x 2 CRC
    # counters) + 1 event poll; row remapping is not asked at all
    assert per_sample == 2 * (9 + 12) + 1
    assert collector.warnings == {}


def test_no_driver_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    fake.no_driver = True
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    with pytest.raises(CollectorUnavailable, match="no NVIDIA driver"):
        NvmlCollector().collect("n", 1.0)


def test_real_pynvml_without_driver_is_unavailable() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(CollectorUnavailable, match="no NVIDIA driver"):
        NvmlCollector().collect("n", 1.0)


def test_lost_gpu_keeps_the_others(fake_nvml: FakeNvml) -> None:
    collector = NvmlCollector()
    collector.collect("n", 1.0)
    fake_nvml.lost.add(3)
    records = collector.collect("n", 2.0)
    assert len(records) == 8
    assert set(records[3]) <= {"v", "kind", "ts", "node", "gpu", "xid"}
    assert records[4]["sm_clock_mhz"] == 1980
    assert collector.warnings["gpu3.sm_clock_mhz"] == "GPU is lost"


def test_close_shuts_nvml_down(fake_nvml: FakeNvml) -> None:
    collector = NvmlCollector()
    collector.collect("n", 1.0)
    assert fake_nvml.initialized == 1
    collector.close()
    assert fake_nvml.initialized == 0


# -- host ------------------------------------------------------------------------


def test_host_reads_this_machine() -> None:
    collector = collectors.create("host", settings())
    first, second = collector.collect("n", 1.0)[0], collector.collect("n", 2.0)[0]
    for record in (first, second):
        assert 0.0 <= record["cpu_pct"] <= 100.0
        assert 0.0 < record["mem_used_pct"] < 100.0
        assert record["load1"] >= 0.0
        validate(record)


def test_ports_are_listed_again_when_one_goes(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(SYSFS_IB2, root)
    collector = InfinibandCollector(root, relist_s=3600)
    assert len(collector.collect("n", 1.0)) == 2
    shutil.rmtree(root / "class/infiniband/mlx5_1")  # driver reset: the HCA is gone
    assert [r["device"] for r in collector.collect("n", 2.0)] == ["mlx5_0"]
    shutil.copytree(SYSFS_IB8 / "class/infiniband/mlx5_7", root / "class/infiniband/mlx5_7")
    # a new HCA shows up at the next listing (here forced by the vanished one)
    assert [r["device"] for r in collector.collect("n", 3.0)] == ["mlx5_0", "mlx5_7"]
