"""Judgement against baselines or the fleet median, and baselines learnt from passing sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardctl.config import Layer, build_settings
from guardctl.errors import ConfigError
from guardctl.sections.sweep import SweepReference
from guardctl.sweep import baseline
from guardctl.sweep.judge import configured_for, judge, judge_all, references
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
    missing = Measurement(
        "nccl", ("n1",), "node", "", 0.0, "nccl|error", error="no result (job 7 failed, exit 1)"
    )
    assert not judge(wrong, None, 0.92).passed
    j = judge(missing, None, 0.92)
    assert not j.passed and "no result" in j.evidence


def test_learn_and_rebuild(tmp_path: Path) -> None:
    learnt = baseline.learn(
        tmp_path, [gpu("n1", "gpu0", 700), gpu("n2", "gpu0", 800)], sweep_id="s1", ts=1.0
    )
    assert [b.value for b in learnt] == [750]
    baseline.learn(tmp_path, [gpu("n3", "gpu0", 790)], sweep_id="s2", ts=2.0)
    assert baseline.values(tmp_path) == {KEY: 790}
    again = baseline.learn(tmp_path, [gpu("n3", "gpu0", 1.0)], sweep_id="s2")
    assert again == []  # the same sweep is learnt once
    keep_two = baseline.learn(tmp_path, [gpu("n4", "gpu0", 600)], sweep_id="s3", keep=2)
    assert keep_two[0].value == 695  # median of the two newest: 790, 600


def test_a_floor_keeps_a_drifting_fleet_from_lowering_its_own_bar(tmp_path: Path) -> None:
    # Every sweep of a slowly degrading fleet passes against the last, so the baseline sinks.
    for n, value in enumerate((780, 740, 700, 660, 620)):
        baseline.learn(tmp_path, [gpu(f"n{n}", "gpu0", value)], sweep_id=f"s{n}", keep=2)
    learnt = baseline.values(tmp_path)
    assert learnt[KEY] == 640
    slow = gpu("n9", "gpu0", 600)
    assert judge(slow, references([slow], learnt)[KEY], 0.92).passed  # drift: it passes
    floors = {"gemm|NVIDIA H200": SweepReference(floor=750)}
    ref = references([slow], learnt, floors)[KEY]
    assert ref.value == 750 and ref.source == "floor"
    j = judge(slow, ref, 0.92)
    assert not j.passed and "floor 750 (baseline 640 is below it)" in j.evidence
    # The floor holds for a fleet median too.
    fleet = [gpu("a", "gpu0", 500), gpu("b", "gpu0", 510)]
    assert references(fleet, {}, floors)[KEY].value == 750


def test_reframe_style_bounds_and_the_most_specific_prefix() -> None:
    conf = {
        "gemm": SweepReference(lower=-0.5),
        "gemm|NVIDIA H200": SweepReference(value=800, lower=-0.05, upper=0.1),
    }
    assert configured_for(KEY, conf) is conf["gemm|NVIDIA H200"]
    assert configured_for("gemm|cpu:x|cpu", conf) is conf["gemm"]
    assert configured_for("nccl|x", conf) is None
    ms = [gpu("n1", "gpu0", 770), gpu("n2", "gpu0", 750), gpu("n3", "gpu0", 900)]
    refs = references(ms, {KEY: 600}, conf)  # a fixed value wins over the learnt baseline
    assert refs[KEY].value == 800 and refs[KEY].source == "reference"
    judged = judge_all(ms, refs, 0.5, configured=conf)
    assert [j.passed for j in judged] == [True, False, False]  # 0.95 x 800 = 760; 1.1 x 800
    assert "< 0.95 x reference 800" in judged[1].evidence
    assert "above the upper bound" in judged[2].evidence


def test_references_are_read_from_the_config() -> None:
    table = {"sweep": {"references": {"gemm|NVIDIA H200": {"floor": 700, "lower": -0.05}}}}
    settings = build_settings([Layer("t", table)])
    assert settings.sweep.references["gemm|NVIDIA H200"] == SweepReference(lower=-0.05, floor=700)
    with pytest.raises(ConfigError, match="lower"):
        build_settings([Layer("t", {"sweep": {"references": {"gemm": {"lower": 0.2}}}})])
