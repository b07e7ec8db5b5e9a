"""The all-reduce parsers on nccl-tests outputs and on allreduce.py's JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardctl.sweep import allreduce_output, get

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def load(name: str) -> allreduce_output.AllreduceRun:
    run = allreduce_output.parse((FIXTURES / name).read_text())
    assert run is not None
    return run


def test_healthy_node_reads_busbw_at_large_messages_and_the_trailer() -> None:
    run = load("h100_8gpu_healthy.txt")
    assert run.backend == "nccl-tests" and run.complete
    assert run.ranks == 8 and run.hosts == ["dgx-a017"]
    assert run.device == "NVIDIA H100 80GB HBM3"
    assert len(run.samples) == 31  # 8 B .. 8 GiB
    assert run.busbw == pytest.approx(479, abs=2)
    assert run.avg_busbw == pytest.approx(157.7491)
    assert run.wrong == 0


def test_degraded_node_is_slower_than_healthy() -> None:
    assert load("h100_8gpu_nvlink_degraded.txt").busbw < 0.92 * load("h100_8gpu_healthy.txt").busbw


def test_two_nodes_ranks_hosts_and_the_slow_link() -> None:
    good, slow = load("h200_2node_ib.txt"), load("h200_2node_ib_slowlink.txt")
    assert good.ranks == 16 and good.hosts == ["gpu-b101", "gpu-b102"]
    assert good.busbw == pytest.approx(48, abs=1)
    assert slow.busbw == pytest.approx(23.5, abs=1)


def test_old_format_without_root_column_and_na_wrong() -> None:
    run = load("old_noroot_na.txt")
    assert run.wrong == 0 and run.device == "NVIDIA A100-SXM4-80GB"
    assert run.samples[-1].size == 1 << 30
    assert run.busbw == pytest.approx(230, abs=3)


def test_wrong_results_are_counted() -> None:
    run = load("wrong_results.txt")
    assert run.wrong > 0
    (m,) = get("nccl").parse((FIXTURES / "wrong_results.txt").read_text(), ("dgx-a099",))
    assert m.wrong > 0


def test_killed_job_keeps_complete_lines_only_and_says_so() -> None:
    run = load("truncated_killed.txt")
    assert not run.complete and run.avg_busbw is None
    assert run.samples[-1].size == 4194304
    (m,) = get("nccl").parse((FIXTURES / "truncated_killed.txt").read_text(), ("dgx-a017",))
    assert "ends early" in m.error


def test_plugin_measurement_keys_name_device_and_shape() -> None:
    (node,) = get("nccl").parse((FIXTURES / "h100_8gpu_healthy.txt").read_text(), ("dgx-a017",))
    assert node.key == "nccl|NVIDIA H100 80GB HBM3|8 ranks" and node.metric == "GB/s"
    text = (FIXTURES / "h200_2node_ib.txt").read_text()
    (pair,) = get("pairwise").parse(text, ("gpu-b101", "gpu-b102"))
    assert pair.key == "pairwise|NVIDIA H200|2 nodes x8" and pair.unit == "group"


def test_json_lines_with_noise() -> None:
    lines = ["srun: warning: something", "not json {"]
    for size, bus in ((1 << 20, 0.2), (2 << 20, 0.4), (4 << 20, 0.5), (8 << 20, 0.6)):
        lines.append(
            json.dumps(
                {
                    "kind": "allreduce_sample",
                    "size": size,
                    "time_us": 10.0,
                    "algbw": bus / 1.5,
                    "busbw": bus,
                    "wrong": 0,
                }
            )
        )
    lines.append(
        json.dumps(
            {
                "kind": "allreduce_result",
                "backend": "numpy-ring",
                "ranks": 4,
                "nodes": ["node1", "node2"],
                "device": "cpu:X x2",
                "busbw_avg": 0.425,
            }
        )
    )
    run = allreduce_output.parse("\n".join(lines))
    assert run is not None and run.complete and run.backend == "numpy-ring"
    assert run.busbw == pytest.approx(0.5)
    assert allreduce_output.parse("garbage only\n") is None
