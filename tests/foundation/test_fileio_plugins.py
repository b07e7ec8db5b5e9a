"""The shared helpers: atomic replacement, exclusive locks, the plugin registry."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from guardctl.errors import ConfigError, StoreError
from guardctl.fileio import atomic_write, locked
from guardctl.plugins import Registry


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "metrics.prom"
    target.write_text("old\n")
    atomic_write(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # readable by node_exporter
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.prom"]


def test_atomic_write_failure_is_a_store_error_and_cleans_up(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot write"):
        atomic_write(tmp_path / "sub" / "f.json", b"x")  # the directory does not exist
    (tmp_path / "taken").mkdir()  # the rename fails: a directory stands at the path
    with pytest.raises(StoreError, match="taken: cannot write"):
        atomic_write(tmp_path / "taken", "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_a_held_lock_refuses_a_second_holder(tmp_path: Path) -> None:
    path = tmp_path / ".lock"
    with locked(path) as handle:
        handle.write("pid 1\n")
        with pytest.raises(BlockingIOError), locked(path, blocking=False):
            pass
    with locked(path, blocking=False):
        pass  # released when the first block ended


def test_registry_refuses_a_duplicate_and_names_the_known_ones() -> None:
    reg: Registry[int] = Registry("collector", unknown=ConfigError)
    reg.add("nvml", 1)
    reg.add("host", 2)
    with pytest.raises(RuntimeError, match="registered twice"):
        reg.add("nvml", 3)
    assert reg.get("nvml") == 1
    assert reg.names() == ["nvml", "host"]
    known = r"agent.collectors: unknown collector 'ib' \(known: nvml, host\)"
    with pytest.raises(ConfigError, match=known):
        reg.get("ib", "agent.collectors")


def test_a_package_registry_finds_every_plugin_file() -> None:
    from guardctl.hooks.registry import CHECKS

    assert {"ecc", "gpu_count", "ib_port", "row_remap", "xid"} <= set(CHECKS.names())
