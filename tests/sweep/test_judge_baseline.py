"""Judgement against baselines or the fleet median, and baselines learnt from passing sweeps."""

from __future__ import annotations

from pathlib import Path

from guardctl.sweep import baseline
from guardctl.sweep.judge import judge, judge_all, references
from guardctl.sweep.registry import Measurement

KEY = "gemm|NVIDIA H200|8x"


def gpu(node: str, unit: str, value: float) -> Measurement:
    return Measurement("gemm", (node,), unit, "TFLOP/s", value, KEY)


def test_baseline_failure_names_the_evidence() -> None:
    refs = references([gpu("n1", "gpu3", 612)], {KEY: 771})
    j = judge(gpu("n1", "gpu3", 612), refs[KEY], 0.92)
    assert not j.passed
    assert j.evidence == "sweep gemm gpu3 612 TFLOP/s < 0.92 x baseline 771"


def test_without_baseline_the_fleet_median_is_the_reference_and_it_says_so() -> None:
    ms = [gpu("n1", "gpu0", 780), gpu("n2", "gpu0", 775), gpu("n3", "gpu0", 500)]
    judged = judge_all(ms, references(ms, {}), 0.92)
    assert [j.passed for j in judged] == [True, True, False]
    assert "fleet median 775 (no baseline, 3 figure(s) from 3 node(s))" in judged[2].evidence


def test_wrong_results_and_missing_results_fail() -> None:
    wrong = Measurement("nccl", ("n1",), "node", "GB/s", 480, "k", wrong=3)
    missing = Measurement("nccl", ("n1",), "node", "", 0.0, "nccl|error",
                          error="no result (job 7 failed, exit 1)")
    assert not judge(wrong, None, 0.92).passed
    j = judge(missing, None, 0.92)
    assert not j.passed and "no result" in j.evidence


def test_learn_and_rebuild(tmp_path: Path) -> None:
    learnt = baseline.learn(tmp_path, [gpu("n1", "gpu0", 700), gpu("n2", "gpu0", 800)],
                            sweep_id="s1", ts=1.0)
    assert [b.value for b in learnt] == [750]
    baseline.learn(tmp_path, [gpu("n3", "gpu0", 790)], sweep_id="s2", ts=2.0)
    assert baseline.values(tmp_path) == {KEY: 790}
    again = baseline.learn(tmp_path, [gpu("n3", "gpu0", 1.0)], sweep_id="s2")
    assert again == []  # the same sweep is learnt once
    keep_two = baseline.learn(tmp_path, [gpu("n4", "gpu0", 600)], sweep_id="s3", keep=2)
    assert keep_two[0].value == 695  # median of the two newest: 790, 600
