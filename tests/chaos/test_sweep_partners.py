"""Known-good partners of a pairwise sweep are never current suspects (flagged in the newest
analysis, watched, quarantined, on a rung of the ladder): a slow partner fails its group and
blames the node swept. And the verdict rules: only a figure below its reference fails; a group
whose job measured nothing clears and blames no one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from controltools import fleet_trace
from sweepchaos import NODES, daemon, decision, log, settings

from guardctl.errors import RefusedError
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.sweep import pairing
from guardctl.sweep.engine import NodeVerdict, SweepOptions, _verdicts, run_sweep
from guardctl.sweep.judge import Reference, judge
from guardctl.sweep.registry import Measurement


def test_the_controller_never_takes_a_watched_suspect_as_a_partner(tmp_path: Path) -> None:
    # node2: a node fault; node1: someone else's load on the host (transient: watched).
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3}, contention=["node1"])
    slurm = MemorySlurm(NODES, start=time.time())
    c = daemon(tmp_path, slurm, sweep_kind="multi")
    report = c.run_pass()
    kinds = {f["node"]: f["kind"] for f in report.findings}
    assert kinds == {"node1": "transient", "node2": "persistent"}, kinds
    assert decision(c, "node1")["decision"] == "watch"
    (started,) = log(c, "sweep started", "node2")
    partners = started.evidence["good_partners"]
    assert partners and "node1" not in partners and "node2" not in partners, partners
    # The partners Slurm holds for the sweep are the same: never node1.
    held = {n for r in slurm.reservations() if r.name.startswith("guardctl_s_") for n in r.nodes}
    assert "node1" not in held


def test_a_one_off_sweep_takes_no_partner_the_controller_suspects(tmp_path: Path) -> None:
    cfg = settings(tmp_path)
    slurm = MemorySlurm(NODES)
    ops = NodeOps(cfg, slurm)
    ops.record("control pass", ["node1"], reason="1 node(s) at fault")
    ops.record(
        "control decision",
        ["node3"],
        reason="transient: host contention",
        evidence={"decision": "watch"},
    )
    report = run_sweep(cfg, ["node5"], SweepOptions(kind="multi", dry_run=True), ops=ops)
    (pair,) = [p for p in report.planned if p["sweep"] == "pairwise"]
    assert pair["good_partners"] == ["node2", "node4", "node6", "node7"], pair
    assert pair["nodes"] == ["node5", "node2"]
    named = settings(tmp_path, sweep={"good_nodes": ["node3", "node4"]})
    with pytest.raises(RefusedError, match="node3 are current suspects"):
        run_sweep(
            named, ["node5"], SweepOptions(kind="multi", dry_run=True), ops=NodeOps(named, slurm)
        )
    assert slurm.reservations() == []


def figure(
    value: float, error: str = "", nodes: tuple[str, ...] = ("n1",), sweep: str = "gemm"
) -> Measurement:
    return Measurement(
        sweep,
        nodes,
        "gpu0" if sweep == "gemm" else "group",
        "TFLOP/s",
        value,
        f"{sweep}|x",
        error=error,
    )


def test_no_figure_is_undetermined_and_only_a_low_figure_fails() -> None:
    ref = Reference(100.0, "baseline")
    none = judge(figure(0.0, "no result (job 3 failed, exit 127)"), ref, 0.92)
    low = judge(figure(50.0), ref, 0.92)
    assert none.undetermined and not none.failed and not none.passed
    assert low.failed and not low.undetermined
    nodes = ["n1", "n2", "n3"]
    judged = [
        none,
        judge(figure(50.0, nodes=("n2",)), ref, 0.92),
        judge(figure(0.0, "x", ("n3",)), ref, 0.92),
        judge(figure(99.0, nodes=("n3",)), ref, 0.92),
    ]
    verdicts = _verdicts(nodes, judged, None)
    assert [(v.node, v.verdict) for v in verdicts] == [
        ("n1", "undetermined"),
        ("n2", "fail"),
        ("n3", "undetermined"),
    ]
    assert isinstance(verdicts[0], NodeVerdict)
    assert verdicts[0].evidence.startswith("undetermined: sweep gemm gpu0: no result")
    both = _verdicts(["n1"], [none, low], None)  # a real failure wins
    assert both[0].verdict == "fail"


def test_a_pairwise_group_that_measured_nothing_clears_and_blames_no_one() -> None:
    def oracle(groups: list[pairing.Group]) -> list[bool | None]:
        return [None if "s2" in g else True for g in groups]

    outcome = pairing.find_bad("regroup", ["s1", "s2", "s3", "s4"], ["g1"], oracle)
    assert outcome.bad == set()
    assert "s2" in outcome.undetermined and outcome.undetermined <= {"s1", "s2"}
    assert {"s3", "s4"} <= outcome.cleared
