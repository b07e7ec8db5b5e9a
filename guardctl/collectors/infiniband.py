"""The ``infiniband`` collector: port state, rate and error counters from sysfs.

Reads ``<sysfs_root>/class/infiniband/<device>/ports/<port>/`` (``state``,
``rate``, ``counters/*``). The sysfs root is a setting so that tests and
benchmarks read recorded trees.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from guardctl.collectors import CollectorUnavailable, Record, register
from guardctl.sections.agent import AgentSettings
from guardctl.telemetry.schema import make_record

# How often the list of HCAs and ports is read again (seconds).
RELIST_S = 60.0

# schema field -> (counter file, multiplier). port_xmit_data and port_rcv_data
# count 4-byte words (IBA spec "octets divided by 4"), so bytes are 4x.
COUNTERS: dict[str, tuple[str, int]] = {
    "symbol_errors": ("symbol_error", 1),
    "link_error_recovery": ("link_error_recovery", 1),
    "link_downed": ("link_downed", 1),
    "rcv_errors": ("port_rcv_errors", 1),
    "xmit_wait": ("port_xmit_wait", 1),
    "xmit_bytes": ("port_xmit_data", 4),
    # extra (not in schema v1, documented in guardctl-schema(5)):
    "rcv_bytes": ("port_rcv_data", 4),
}


def _read(path: str) -> str | None:
    # os.open/os.read rather than pathlib: this runs ~70 times a sample on 8 ports.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # a counter this HCA or driver does not have
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_state(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``."""
    return text.partition(":")[2].strip() or text.strip()


def parse_rate_gbps(text: str) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> ``400.0``; None if unparseable."""
    head = text.split()[0] if text.split() else ""
    try:
        return float(head)
    except ValueError:
        return None


def read_port(port_dir: str) -> dict[str, object]:
    """The schema-v1 ``nic`` fields of one port directory (missing files left out)."""
    values: dict[str, object] = {}
    state = _read(f"{port_dir}/state")
    if state is not None:
        values["state"] = parse_state(state)
    rate = _read(f"{port_dir}/rate")
    if rate is not None and (gbps := parse_rate_gbps(rate)) is not None:
        values["rate_gbps"] = gbps
    for field, (filename, scale) in COUNTERS.items():
        text = _read(f"{port_dir}/counters/{filename}")
        if text is not None and text.isdigit():
            values[field] = int(text) * scale
    return values


class InfinibandCollector:
    """One ``nic`` record per HCA port."""

    name = "infiniband"

    def __init__(self, sysfs_root: Path, relist_s: float = RELIST_S) -> None:
        self.class_dir = sysfs_root / "class" / "infiniband"
        self.relist_s = relist_s
        self._ports: list[tuple[str, int, str]] = []
        self._listed_at = -float("inf")

    def ports(self) -> list[tuple[str, int, str]]:
        """(device, port number, directory) of every port, sorted."""
        found = []
        for device_dir in sorted(self.class_dir.iterdir()):
            ports_dir = device_dir / "ports"
            if not ports_dir.is_dir():
                continue
            for port_dir in ports_dir.iterdir():
                if port_dir.name.isdigit():
                    found.append((device_dir.name, int(port_dir.name), str(port_dir)))
        return sorted(found)

    def collect(self, node: str, ts: float) -> list[Record]:
        now = time.monotonic()
        if now - self._listed_at >= self.relist_s:
            # HCAs can disappear (driver reset) and come back: list them again
            # now and then, not every sample.
            if not self.class_dir.is_dir():
                raise CollectorUnavailable(f"no InfiniBand devices ({self.class_dir} not found)")
            self._ports = self.ports()
            self._listed_at = now
        records = []
        for device, port, port_dir in self._ports:
            values = read_port(port_dir)
            if not values:
                self._listed_at = -float("inf")  # the port is gone: list again next time
                continue
            records.append(make_record("nic", node, ts, device=device, port=port, **values))
        return records

    def close(self) -> None:
        pass


def _factory(settings: AgentSettings) -> InfinibandCollector:
    return InfinibandCollector(Path(settings.sysfs_root))


register("infiniband", _factory)
