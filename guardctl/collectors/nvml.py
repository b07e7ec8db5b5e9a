"""The ``nvml`` collector: per-GPU clocks, power, temperature, throttling, errors and XIDs.

Reads NVML through nvidia-ml-py (``import pynvml``). The module is imported
when the collector starts, never at import time, so a node without the driver
(or the package) still runs the other collectors. Fields an older GPU lacks
(``NVMLError_NotSupported``) are left out of its records and not asked again.
XID events come from an NVML event set polled with a 0 ms wait once a sample.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from guardctl.collectors import CollectorUnavailable, Record, register
from guardctl.sections.agent import AgentSettings
from guardctl.telemetry.schema import make_record

log = logging.getLogger("guardctl.agent")

# More XID events than this in one interval means a GPU in a storm: keep the last.
MAX_EVENTS_PER_SAMPLE = 1000


def _load_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise CollectorUnavailable("nvidia-ml-py (pynvml) is not installed") from None


class _Gpu:
    """One device handle and what it turned out not to support."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.unsupported: set[str] = set()
        self.nvlinks: list[int] = []


class NvmlCollector:
    """One ``gpu`` record per GPU per sample."""

    name = "nvml"

    def __init__(self) -> None:
        self.nv: ModuleType | None = None
        self.gpus: list[_Gpu] = []
        self.event_set: Any = None
        self.by_index: dict[int, _Gpu] = {}
        # this sample's failed reads other than NotSupported, for the agent's status
        self.warnings: dict[str, str] = {}

    # -- start and stop ---------------------------------------------------

    def _start(self) -> ModuleType:
        nv = _load_pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError_LibraryNotFound:
            raise CollectorUnavailable("no NVIDIA driver (libnvidia-ml not found)") from None
        except nv.NVMLError_DriverNotLoaded:
            raise CollectorUnavailable("no NVIDIA driver (driver not loaded)") from None
        except nv.NVMLError as exc:
            raise CollectorUnavailable(f"NVML init failed: {exc}") from None
        self.nv = nv
        count = nv.nvmlDeviceGetCount()
        self.gpus = [_Gpu(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        self.by_index = {gpu.index: gpu for gpu in self.gpus}
        for gpu in self.gpus:
            gpu.nvlinks = self._active_nvlinks(gpu)
        self.event_set = self._register_xid_events()
        return nv

    def _active_nvlinks(self, gpu: _Gpu) -> list[int]:
        nv = self.nv
        assert nv is not None
        links = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(gpu.handle, link) == nv.NVML_FEATURE_ENABLED:
                    links.append(link)
            except nv.NVMLError:
                # NotSupported / InvalidArgument past the last link, or no NVLink at all.
                continue
        return links

    def _register_xid_events(self) -> Any:
        nv = self.nv
        assert nv is not None
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("nvml: XID events unavailable: %s", exc)
            return None
        for gpu in self.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except nv.NVMLError as exc:
                gpu.unsupported.add("xid")
                log.warning("nvml: GPU %d: XID events unavailable: %s", gpu.index, exc)
        return event_set

    def close(self) -> None:
        nv, self.nv = self.nv, None
        if nv is None:
            return
        try:
            if self.event_set is not None:
                nv.nvmlEventSetFree(self.event_set)
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass  # shutting down anyway
        self.event_set = None

    # -- one sample -------------------------------------------------------

    def collect(self, node: str, ts: float) -> list[Record]:
        self.warnings = {}
        nv = self.nv or self._start()
        xids = self._drain_xids(nv)
        records = []
        for gpu in self.gpus:
            values = self._read_gpu(nv, gpu)
            if "xid" not in gpu.unsupported:
                values["xid"] = xids.get(gpu.index)
            records.append(make_record("gpu", node, ts, gpu=gpu.index, **values))
        return records

    def _drain_xids(self, nv: ModuleType) -> dict[int, int]:
        """The last XID of each GPU since the previous sample."""
        last: dict[int, int] = {}
        if self.event_set is None:
            return last
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = nv.nvmlEventSetWait(self.event_set, 0)
            except nv.NVMLError_Timeout:
                break  # no more events
            except nv.NVMLError as exc:
                self.warnings["xid"] = str(exc)
                break
            if data.eventType == nv.nvmlEventTypeXidCriticalError:
                try:
                    index = nv.nvmlDeviceGetIndex(data.device)
                except nv.NVMLError:
                    continue
                last[index] = int(data.eventData)
        return last

    def _read_gpu(self, nv: ModuleType, gpu: _Gpu) -> dict[str, Any]:
        h = gpu.handle
        readers: dict[str, Callable[[], Any]] = {
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "util_pct": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
            "clock_event_reasons": lambda: _clock_event_reasons(nv, h),
            "ecc_sbe_volatile": lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC
            ),
            "ecc_dbe_volatile": lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            ),
            "pcie_replay": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
            "nvlink_crc_errors": lambda: _nvlink_crc(nv, gpu),
            # extra field (not in schema v1): a row remap waits for a GPU reset
            "row_remap_pending": lambda: bool(nv.nvmlDeviceGetRemappedRows(h)[2]),
        }
        values: dict[str, Any] = {}
        for field, read in readers.items():
            if field in gpu.unsupported:
                continue
            try:
                values[field] = read()
            except nv.NVMLError_NotSupported:
                gpu.unsupported.add(field)
            except nv.NVMLError as exc:
                # A lost GPU fails every call: report the field missing, keep the rest.
                self.warnings[f"gpu{gpu.index}.{field}"] = str(exc)
        return values


def _clock_event_reasons(nv: ModuleType, handle: Any) -> int:
    # Renamed from "throttle reasons" in driver 535; older pynvml has only the old name.
    getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if getter is None:
        getter = nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(getter(handle))


def _nvlink_crc(nv: ModuleType, gpu: _Gpu) -> int:
    """CRC errors (flit + data) summed over the GPU's active NVLinks (cumulative)."""
    if not gpu.nvlinks:
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
    total = 0
    for link in gpu.nvlinks:
        for counter in (nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, nv.NVML_NVLINK_ERROR_DL_CRC_DATA):
            try:
                total += nv.nvmlDeviceGetNvLinkErrorCounter(gpu.handle, link, counter)
            except nv.NVMLError_NotSupported:
                continue  # CRC data counter is gone on newer GPUs; flit remains
    return total


def _factory(settings: AgentSettings) -> NvmlCollector:
    return NvmlCollector()


register("nvml", _factory)
