"""The analyzer compares busy time per sample, and ranks with the ranks of their own stage."""

from __future__ import annotations

import random
from pathlib import Path

from guardctl.analyze import Analysis, analyze
from guardctl.config import load_settings
from guardctl.telemetry import schema

T0 = 1_796_000_000.0
STEPS = 900  # 15 minutes at one step a second: three default windows


def write_steps(
    root: Path,
    ranks: list[dict[str, object]],
    seconds: list[float],
    samples: list[int | None],
    *,
    steps: int = STEPS,
    later: list[float] | None = None,
) -> None:
    """One rank per node: rank r computes seconds[r] (x noise) on samples[r] per step, and
    later[r] in the last STEPS steps where *later* is given."""
    rng = random.Random(1)
    out = root / "steps" / "7"
    out.mkdir(parents=True)
    for r, role in enumerate(ranks):
        lines = []
        for step in range(steps):
            now = later if later is not None and step >= steps - STEPS else seconds
            compute = now[r] * rng.uniform(0.97, 1.03)
            extra = {"samples": samples[r]} if samples[r] is not None else {}
            rec = schema.make_record(
                "step",
                f"node{r}",
                T0 + step,
                job="7",
                rank=r,
                step=step,
                step_s=2.0,
                compute_s=compute,
                comm_s=2.0 - compute,
                **extra,
                **role,
            )
            lines.append(schema.dumps(rec) + "\n")
        (out / f"node{r}.r{r}.jsonl").write_text("".join(lines))


def run(root: Path) -> Analysis:
    return analyze(root, load_settings(assignments=(), environ={}), None)


def suspects(result: Analysis) -> list[str]:
    return [n.node for n in result.nodes if n.verdict == "suspect"]


def test_a_rebalanced_straggler_is_found_per_sample(tmp_path: Path) -> None:
    # Per-step sharding gave rank 3 a twelfth of the others' share: its compute_s is normal.
    write_steps(tmp_path, [{}] * 4, [0.5, 0.5, 0.5, 0.52], [24, 24, 24, 2])
    assert suspects(run(tmp_path)) == ["node3"]


def test_without_samples_equal_busy_times_are_healthy(tmp_path: Path) -> None:
    write_steps(tmp_path, [{}] * 4, [0.5, 0.5, 0.5, 0.52], [None] * 4)
    assert suspects(run(tmp_path)) == []


def test_a_zero_share_step_says_nothing(tmp_path: Path) -> None:
    write_steps(tmp_path, [{}] * 4, [0.5, 0.5, 0.5, 0.01], [24, 24, 24, 0])
    assert suspects(run(tmp_path)) == []


def test_a_heavier_pipeline_stage_is_not_a_node_fault(tmp_path: Path) -> None:
    # 2 stages x 4 data-parallel replicas; the last stage (the loss) is 63% heavier everywhere.
    roles = [{"pp_stage": s, "dp_rank": d} for s in (0, 1) for d in range(4)]
    write_steps(tmp_path, roles, [0.5] * 4 + [0.815] * 4, [None] * 8)
    assert suspects(run(tmp_path)) == []


def test_a_slow_rank_among_three_peers_of_its_stage_is_found(tmp_path: Path) -> None:
    roles = [{"pp_stage": s, "dp_rank": d} for s in (0, 1) for d in range(4)]
    write_steps(tmp_path, roles, [0.5] * 4 + [0.815, 0.815, 1.63, 0.815], [None] * 8)
    assert suspects(run(tmp_path)) == ["node6"]


def test_a_job_too_small_to_compare_says_so(tmp_path: Path) -> None:
    write_steps(tmp_path, [{}] * 2, [0.5, 1.5], [None] * 2)
    result = run(tmp_path)
    assert suspects(result) == []
    for verdict in result.nodes:
        assert verdict.reasons[0].startswith("ranks not judged: fewer than 3 ranks"), verdict


def test_analyze_summary_counts_the_nodes_not_judged(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from guardctl.cli import main

    write_steps(tmp_path, [{}] * 2, [0.5, 1.5], [None] * 2)
    run_ = CliRunner().invoke(main, ["analyze", "--input", str(tmp_path)], env={})
    assert "(2 with ranks not judged: too few peers)" in run_.output, run_.output


def test_a_heavier_stage_on_every_replica_is_the_jobs_finding(tmp_path: Path) -> None:
    roles = [{"pp_stage": s, "dp_rank": d} for s in (0, 1, 2) for d in range(4)]
    write_steps(tmp_path, roles, [0.5] * 8 + [0.7] * 4, [None] * 12)
    result = run(tmp_path)
    assert suspects(result) == []
    (stage,) = result.stages
    assert (stage.job, stage.stage, stage.windows) == ("7", 2, 3)
    assert stage.nodes == ("node10", "node11", "node8", "node9")
    assert 1.3 < stage.ratio < 1.4  # the fastest of its ranks, 0.7 x 0.97, over 0.5
    assert result.to_dict()["stages"][0]["stage"] == 2


def test_one_slow_rank_is_a_node_not_its_stage(tmp_path: Path) -> None:
    roles = [{"pp_stage": s, "dp_rank": d} for s in (0, 1) for d in range(4)]
    write_steps(tmp_path, roles, [0.5] * 4 + [0.5, 0.5, 1.0, 0.5], [None] * 8)
    result = run(tmp_path)
    assert suspects(result) == ["node6"] and result.stages == ()


def test_stages_of_equal_work_are_no_finding(tmp_path: Path) -> None:
    roles = [{"pp_stage": s, "dp_rank": d} for s in (0, 1) for d in range(4)]
    write_steps(tmp_path, roles, [0.5] * 8, [None] * 8)
    assert run(tmp_path).stages == ()


def three_d(pp: int, tp: int, dp: int) -> list[dict[str, object]]:
    """The roles of a pp x tp x dp job, one rank per node, replicas outermost."""
    return [
        {"pp_stage": s, "tp_rank": t, "dp_rank": d}
        for d in range(dp)
        for s in range(pp)
        for t in range(tp)
    ]


def test_a_heavier_tensor_parallel_place_on_every_replica_is_not_a_node_fault(
    tmp_path: Path,
) -> None:
    # 2 stages x 2 tensor-parallel ranks x 4 replicas; tp rank 1 of stage 1 holds the loss
    # (say) and is 40% heavier on every replica: its peers are its replicas, not its stage.
    roles = three_d(2, 2, 4)
    seconds = [0.7 if r["pp_stage"] == 1 and r["tp_rank"] == 1 else 0.5 for r in roles]
    write_steps(tmp_path, roles, seconds, [None] * 16)
    assert suspects(run(tmp_path)) == []


def test_a_slow_rank_among_its_replicas_is_found(tmp_path: Path) -> None:
    roles = three_d(2, 2, 4)
    seconds = [0.7 if r["pp_stage"] == 1 and r["tp_rank"] == 1 else 0.5 for r in roles]
    slow = roles.index({"pp_stage": 1, "tp_rank": 0, "dp_rank": 2})
    seconds[slow] = 1.0  # twice its three replicas
    write_steps(tmp_path, roles, seconds, [None] * 16)
    assert suspects(run(tmp_path)) == [f"node{slow}"]


def test_too_few_replicas_compare_the_tensor_parallel_ranks_of_the_stage(tmp_path: Path) -> None:
    # 2 replicas of each place: too few; the 4 tensor-parallel ranks of a stage split each
    # layer evenly and are compared instead.
    roles = three_d(1, 4, 2)
    seconds = [0.5] * 8
    seconds[5] = 1.0
    write_steps(tmp_path, roles, seconds, [None] * 8)
    assert suspects(run(tmp_path)) == ["node5"]


def test_one_replicas_slow_tensor_parallel_group_is_not_a_heavy_stage(tmp_path: Path) -> None:
    # One replica: stage 1's four tensor-parallel ranks all wait for one slow GPU inside
    # every layer. Four ranks, but one replica: no stage finding can be made of it.
    roles = three_d(2, 4, 1)
    write_steps(tmp_path, roles, [0.5] * 4 + [0.75] * 4, [None] * 8)
    assert run(tmp_path).stages == ()


# --- small jobs against their own history: 30 minutes of steps, the first half the history ---


def test_a_small_job_holding_its_pace_is_healthy_and_says_how_it_was_judged(
    tmp_path: Path,
) -> None:
    write_steps(tmp_path, [{}] * 2, [0.5, 0.9], [None] * 2, steps=2 * STEPS)
    result = run(tmp_path)
    assert suspects(result) == []
    for verdict in result.nodes:
        assert verdict.reasons[0].startswith(
            "ranks judged against their own history: fewer than 3 ranks"
        ), verdict


def test_a_small_jobs_rank_slower_than_its_own_history_is_found(tmp_path: Path) -> None:
    write_steps(tmp_path, [{}] * 2, [0.5, 0.5], [None] * 2, steps=2 * STEPS, later=[0.5, 1.0])
    result = run(tmp_path)
    assert suspects(result) == ["node1"]
    (verdict,) = result.suspects
    assert "vs its own earlier 0.5" in verdict.reasons[0], verdict.reasons
    assert verdict.evidence[0].detector == "busy_history" and verdict.evidence[0].rank == 1


def test_a_small_job_slowing_down_as_a_whole_is_no_node_fault(tmp_path: Path) -> None:
    # a new phase (longer sequences, say): both ranks at once, neither node is to blame
    write_steps(tmp_path, [{}] * 2, [0.5, 0.5], [None] * 2, steps=2 * STEPS, later=[1.0, 1.0])
    assert suspects(run(tmp_path)) == []


def test_a_one_rank_job_has_no_witness_and_is_not_judged(tmp_path: Path) -> None:
    write_steps(tmp_path, [{}], [0.5], [None], steps=2 * STEPS, later=[1.0])
    result = run(tmp_path)
    assert suspects(result) == []
    assert result.nodes[0].reasons[0].endswith("no other rank of its own to compare with")


def test_own_history_off_leaves_small_jobs_unjudged(tmp_path: Path) -> None:
    write_steps(tmp_path, [{}] * 2, [0.5, 0.5], [None] * 2, steps=2 * STEPS, later=[0.5, 1.0])
    settings = load_settings(assignments=("analyze.own_history=0",), environ={})
    result = analyze(tmp_path, settings, None)
    assert suspects(result) == []
    assert result.nodes[0].reasons[0].startswith("ranks not judged: fewer than 3 ranks")


def test_analyze_summary_counts_the_nodes_judged_on_their_own_history(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from guardctl.cli import main

    write_steps(tmp_path, [{}] * 2, [0.5, 0.9], [None] * 2, steps=2 * STEPS)
    run_ = CliRunner().invoke(main, ["analyze", "--input", str(tmp_path)], env={})
    assert "(2 with ranks judged against their own history only)" in run_.output, run_.output


def test_work_moved_between_a_small_jobs_ranks_is_no_node_fault(tmp_path: Path) -> None:
    # Per-step sharding without sample counts: rank 0 took over most of rank 1's share.
    write_steps(tmp_path, [{}] * 2, [0.5, 0.5], [None] * 2, steps=2 * STEPS, later=[0.8, 0.2])
    assert suspects(run(tmp_path)) == []
