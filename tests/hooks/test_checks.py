"""Hook checks on injected faults: a fake at the pynvml boundary, a recorded sysfs tree."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hooktools import write_straggler_job

from guardctl.config import Settings, load_settings
from guardctl.hooks.registry import HookContext, checks, guarded
from guardctl.hooks.run import straggler_summary
from guardctl.storage import layout
from guardctl.telemetry import schema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SYSFS = FIXTURES / "sysfs" / "ib8"
sys.path.insert(0, str(FIXTURES / "nvml"))
from fake_pynvml import FakeNvml  # noqa: E402


def fake_nvml(
    gpus: int = 8,
    dbe: dict[int, int] | None = None,
    remap: dict[int, tuple[int, int, int, int]] | None = None,
    missing: bool = False,
) -> Any:
    """The shared fake pynvml (recorded H200 values), with faults injected into its values."""
    fake = FakeNvml("h200_sxm_8gpu.json")
    fake.gpus = fake.gpus[:gpus]
    for gpu in fake.gpus:  # the recording's grey GPU 5 has a remap pending: start healthy
        gpu["remapped_rows"] = [0, 0, 0, 0]
    for index, count in (dbe or {}).items():
        fake.gpus[index]["ecc_uncorrected_volatile"] = count
    for index, rows in (remap or {}).items():
        fake.gpus[index]["remapped_rows"] = list(rows)
    fake.no_driver = missing
    return fake.module()


def settings(tmp_path: Path, sysfs: Path | None = None, gpus: int = 8) -> Settings:
    base = load_settings(environ={})
    return replace(
        base,
        store=replace(base.store, root=tmp_path / "store"),
        agent=replace(base.agent, sysfs_root=str(sysfs or tmp_path / "nosys")),
        sweep=replace(base.sweep, hook_gpus=gpus),
    )


def run(tmp_path: Path, nvml: Any, sysfs: Path | None = None, gpus: int = 8) -> dict[str, Any]:
    ctx = HookContext(settings(tmp_path, sysfs, gpus), "node7", nvml=nvml)
    return {r.check: r for r in (guarded(c, ctx) for c in checks("prolog"))}


def test_healthy_node_passes(tmp_path: Path) -> None:
    results = run(tmp_path, fake_nvml(), SYSFS)
    assert all(r.ok for r in results.values()), results
    assert results["ib_port"].message == "8 port(s) active"


def test_missing_gpu_ecc_and_row_remap_fail(tmp_path: Path) -> None:
    results = run(tmp_path, fake_nvml(gpus=7, dbe={3: 2}, remap={5: (0, 1, 1, 0)}))
    assert results["gpu_count"].message == "7 of 8 GPUs visible"
    assert results["ecc"].message == "gpu3 2 uncorrectable ECC"
    assert results["row_remap"].message == "gpu5 row remap pending (reset needed)"


def test_no_driver_is_skipped_unless_gpus_are_expected(tmp_path: Path) -> None:
    assert run(tmp_path, fake_nvml(missing=True), gpus=0)["gpu_count"].skipped
    failed = run(tmp_path, fake_nvml(missing=True), gpus=8)["gpu_count"]
    assert not failed.ok and "no NVIDIA driver" in failed.message


def test_ib_port_down_and_downshifted(tmp_path: Path) -> None:
    tree = tmp_path / "sys"
    shutil.copytree(SYSFS, tree)
    ports = tree / "class" / "infiniband"
    (ports / "mlx5_3" / "ports" / "1" / "state").write_text("1: DOWN\n")
    (ports / "mlx5_5" / "ports" / "1" / "rate").write_text("200 Gb/sec (4X HDR)\n")
    result = run(tmp_path, fake_nvml(), tree)["ib_port"]
    assert not result.ok
    assert result.message == "ib mlx5_3/1 state DOWN, ib mlx5_5/1 rate 200 Gb/s < 400"


def test_recent_hardware_xid_fails_an_application_xid_does_not(tmp_path: Path) -> None:
    s = settings(tmp_path)
    ctx = HookContext(s, "node7", nvml=fake_nvml())
    path = layout.node_telemetry_file(s.store.root, "node7", ctx.now)
    path.parent.mkdir(parents=True)
    records = [
        schema.make_record("gpu", "node7", ctx.now - 30, gpu=2, xid=13),
        schema.make_record("gpu", "node7", ctx.now - 3000, gpu=1, xid=79),
    ]
    path.write_text("".join(schema.dumps(r) + "\n" for r in records))
    (xid,) = [c for c in checks("prolog") if c.name == "xid"]
    assert xid.run(ctx).ok
    records.append(schema.make_record("gpu", "node7", ctx.now - 20, gpu=4, xid=79))
    path.write_text("".join(schema.dumps(r) + "\n" for r in records))
    result = xid.run(ctx)
    assert not result.ok and result.message.startswith("gpu4 XID 79")
    # A node whose agent wrote nothing lately: nothing judged, and said so.
    quiet = xid.run(HookContext(s, "node8", nvml=fake_nvml()))
    assert quiet.ok and quiet.skipped and "no agent telemetry" in quiet.message
    # An agent of an earlier version: its directory per node is read as well.
    old = path.parent.parent / "node8" / f"{path.parent.name}.jsonl"
    old.parent.mkdir()
    old.write_text(
        schema.dumps(schema.make_record("gpu", "node8", ctx.now - 5, gpu=0, xid=48)) + "\n"
    )
    result = xid.run(HookContext(s, "node8", nvml=fake_nvml()))
    assert not result.ok and result.message.startswith("gpu0 XID 48")


def test_epilog_straggler_summary(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_straggler_job(root)
    summary = straggler_summary(root, "42")
    assert summary == "job 42: straggler(s) node3; slowest node3 compute 1.4 s vs job median 1.02 s"
