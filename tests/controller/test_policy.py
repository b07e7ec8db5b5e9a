"""Fast tests of the controller's pure parts: classification, the ladder, the decisions."""

from __future__ import annotations

from guardctl.actionlog import Entry
from guardctl.analyze.engine import Analysis, Evidence, NodeVerdict
from guardctl.controller.classify import classify, node_kind
from guardctl.controller.ladder import derive
from guardctl.controller.policy import View, decide
from guardctl.sections.control import ControlSettings
from guardctl.slurm.types import JobInfo

NOW = 1_800_000_000.0


def ev(detector: str, end: float = NOW) -> Evidence:
    return Evidence(detector, "m", "u", 2.0, 1.0, 1.0, 2.0, end - 300, end)


def verdict(
    node: str, *detectors: str, job: str = "j1", suspect: bool = True, impact: dict | None = None
) -> NodeVerdict:
    return NodeVerdict(
        node,
        "suspect" if suspect else "healthy",
        2.0,
        (),
        evidence=tuple(ev(d) for d in detectors),
        flagged_windows=3,
        job=job,
        impact=impact,
    )


def analysis(*flagged: NodeVerdict, nodes: int = 8, job: str = "j1") -> Analysis:
    names = {v.node for v in flagged}
    rest = [
        NodeVerdict(f"n{i}", "healthy", 0.0, job=job)
        for i in range(1, nodes + 1)
        if f"n{i}" not in names
    ]
    return Analysis(NOW - 300, NOW, (*flagged, *rest))


def entry(
    action: str, nodes: list[str], ts: float, phase: str = "note", **evidence: object
) -> Entry:
    return Entry(f"{action}{ts}", ts, action, phase, tuple(nodes), evidence=dict(evidence))


def view(
    a: Analysis,
    cfg: ControlSettings,
    *,
    entries: list[Entry] = (),  # type: ignore[assignment]
    owners: dict | None = None,
    running: dict | None = None,
    **kw: object,
) -> View:
    return View(classify(a, cfg), owners or {}, running or {}, derive(entries), NOW, 10.0, **kw)  # type: ignore[arg-type]


CFG = ControlSettings()


def test_kinds_of_single_nodes() -> None:
    assert node_kind(verdict("n1", "thermal"))[0] == "persistent"
    assert node_kind(verdict("n1", "busy_time"))[0] == "persistent"
    assert node_kind(verdict("n1", "host_contention"))[0] == "transient"
    assert node_kind(verdict("n1", "busy_time", suspect=False))[0] == "transient"
    assert node_kind(verdict("n1", "host_contention", "xid"))[0] == "persistent"


def test_too_many_of_a_job_rack_or_fleet_is_structural() -> None:
    fleet = classify(analysis(*(verdict(f"n{i}", "thermal") for i in range(1, 4))), CFG)
    assert [f.scope for f in fleet.fleet] == ["fleet"]
    assert {f.kind for f in fleet.findings} == {"structural"}
    # One job of 4 among 20 nodes: 3 of its 4 flagged is the job's cause, not the fleet's.
    job = [verdict(f"n{i}", "busy_time", job="big") for i in range(1, 4)]
    a = Analysis(
        NOW - 300,
        NOW,
        (
            *job,
            NodeVerdict("n4", "healthy", 0.0, job="big"),
            *(NodeVerdict(f"m{i}", "healthy", 0.0, job="other") for i in range(16)),
        ),
    )
    cfg = ControlSettings(max_fleet_fraction=0.5)
    assert [(f.scope, f.name) for f in classify(a, cfg).fleet] == [("job", "big")]
    rack = ControlSettings(max_fleet_fraction=0.5, racks={"r1": "n[1-4]"})
    spread = [verdict(f"n{i}", "thermal", job=f"j{i}") for i in range(1, 4)]
    a = Analysis(
        NOW - 300,
        NOW,
        (
            *spread,
            NodeVerdict("n4", "healthy", 0.0, job="j9"),
            *(NodeVerdict(f"m{i}", "healthy", 0.0, job="x") for i in range(16)),
        ),
    )
    assert [(f.scope, f.name) for f in classify(a, rack).fleet] == [("rack", "r1")]
    # One node alone is never a common cause.
    assert classify(analysis(verdict("n1", "thermal"), nodes=2), CFG).fleet == ()


def test_two_grey_nodes_of_a_small_cluster_are_two_node_faults() -> None:
    # min_group bounds the flagged set, not the fleet: a pair of grey nodes in an 8-node
    # cluster (over 0.2 of it) is two node faults, each to be quarantined.
    a = analysis(verdict("n2", "busy_time"), verdict("n5", "busy_time"), nodes=8)
    c = classify(a, CFG)
    assert c.fleet == () and {f.kind for f in c.findings} == {"persistent"}
    assert {d.action for d in decide(view(a, CFG), CFG)} == {"quarantine"}


def test_the_narrowest_scope_that_explains_the_flagged_nodes_wins() -> None:
    # Three of a 4-node job's nodes in an 8-node cluster: over the fleet's fraction too, but
    # the job holds them all: the job's cause, not the fleet's.
    job = [verdict(f"n{i}", "busy_time", job="small") for i in range(1, 4)]
    a = Analysis(
        NOW - 300,
        NOW,
        (
            *job,
            NodeVerdict("n4", "healthy", 0.0, job="small"),
            *(NodeVerdict(f"n{i}", "healthy", 0.0, job="other") for i in range(5, 9)),
        ),
    )
    assert [(f.scope, f.name) for f in classify(a, CFG).fleet] == [("job", "small")]
    # Spread over jobs, the same three are the fleet's.
    spread = [verdict(f"n{i}", "thermal", job=f"j{i}") for i in range(1, 4)]
    a = Analysis(
        NOW - 300,
        NOW,
        (*spread, *(NodeVerdict(f"n{i}", "healthy", 0.0, job="x") for i in range(4, 9))),
    )
    assert [f.scope for f in classify(a, CFG).fleet] == ["fleet"]
    # A job that spans the whole fleet is no narrower than the fleet.
    whole = [verdict(f"n{i}", "thermal", job="all") for i in range(1, 9)]
    assert [f.scope for f in classify(Analysis(NOW - 300, NOW, tuple(whole)), CFG).fleet] == [
        "fleet"
    ]


def test_the_fleet_is_the_nodes_slurm_knows_not_the_nodes_seen() -> None:
    spread = [verdict(f"n{i}", "thermal", job=f"j{i}") for i in range(1, 4)]
    a = Analysis(
        NOW - 300,
        NOW,
        (*spread, *(NodeVerdict(f"n{i}", "healthy", 0.0, job="x") for i in range(4, 9))),
    )
    assert [f.scope for f in classify(a, CFG).fleet] == ["fleet"]  # 3 of the 8 seen
    wide = classify(a, CFG, fleet_size=100)  # 3 of the 100 Slurm knows: node faults
    assert wide.fleet == () and {f.kind for f in wide.findings} == {"persistent"}


def test_a_slower_model_mixed_into_a_job_is_heterogeneity() -> None:
    cfg = ControlSettings(models={"A100": "n[1-2]", "H100": "n[3-8]"})
    c = classify(
        analysis(verdict("n1", "busy_time"), verdict("n2", "busy_time"), nodes=8),
        ControlSettings(max_fleet_fraction=1.0, max_job_fraction=1.0, models=cfg.models),
    )
    assert {f.kind for f in c.findings} == {"heterogeneity"}
    d = decide(
        view(
            analysis(verdict("n1", "busy_time"), verdict("n2", "busy_time")),
            ControlSettings(max_fleet_fraction=1.0, max_job_fraction=1.0, models=cfg.models),
        ),
        cfg,
    )
    assert {x.action for x in d} == {"rebalance"}


def test_ladder_quarantine_wait_sweep_from_values() -> None:
    a = analysis(verdict("n2", "busy_time"))
    job = JobInfo(41, "train", "u", "RUNNING", ("n1", "n2"))
    (d,) = decide(view(a, CFG, running={"n2": [job]}), CFG)
    assert (d.action, d.rung, d.jobs) == ("quarantine", "b", (41,))
    log = [entry("quarantine", ["n2"], NOW - 60, "done", by="control")]
    owners = {"n2": ("quarantined", "reservation guardctl_q_n2")}
    (d,) = decide(view(a, CFG, entries=log, owners=owners, running={"n2": [job]}), CFG)
    assert d.action == "wait" and "41" in d.why
    (d,) = decide(view(a, CFG, entries=log, owners=owners), CFG)
    assert (d.action, d.rung, d.duration_s) == ("sweep", "c", 10.0)


def test_relapses_lengthen_the_sweep_and_a_lemon_is_swept_once_more_then_drained() -> None:
    cfg = ControlSettings(relapses=2, relapse_sweep_factor=3.0)
    a = analysis(verdict("n2", "busy_time"))
    passed = [entry("control sweep", ["n2"], NOW - 900, verdict="pass")]
    (d,) = decide(view(a, cfg, entries=passed), cfg)
    assert (d.action, d.rung) == ("quarantine", "e") and "relapse 1" in d.why
    log = [*passed, entry("quarantine", ["n2"], NOW - 60, "done", by="control")]
    owners = {"n2": ("quarantined", "")}
    (d,) = decide(view(a, cfg, entries=log, owners=owners), cfg)
    assert d.action == "sweep" and d.duration_s == 30.0
    assert not d.evidence["lemon"]
    # The relapses-th relapse: one more, longest sweep, then a drain whatever it shows.
    twice = [*passed, entry("control sweep", ["n2"], NOW - 600, verdict="pass")]
    (d,) = decide(view(a, cfg, entries=twice), cfg)
    assert (d.action, d.rung) == ("quarantine", "e") and "lemon" in d.why and d.evidence["lemon"]
    log = [*twice, entry("quarantine", ["n2"], NOW - 60, "done", by="control")]
    (d,) = decide(view(a, cfg, entries=log, owners=owners), cfg)
    assert (d.action, d.duration_s) == ("sweep", 90.0) and d.evidence["lemon"], d
    # A pass outside the relapse window does not count.
    old = [entry("control sweep", ["n2"], NOW - 8 * 86400, verdict="pass")]
    (d,) = decide(view(a, cfg, entries=old), cfg)
    assert (d.action, d.rung) == ("quarantine", "b")


def test_data_from_before_a_pass_is_no_relapse() -> None:
    a = analysis(verdict("n2", "busy_time"))
    later = [entry("control sweep", ["n2"], NOW + 10, verdict="pass")]
    (d,) = decide(view(a, CFG, entries=later), CFG)
    assert d.action == "none" and "before its sweep passed" in d.why


def test_someone_elses_node_is_left_alone_and_transients_watched() -> None:
    a = analysis(verdict("n2", "thermal"), verdict("n3", "host_contention"))
    owners = {"n2": ("held by someone else", "admin: DIMM")}
    d = {x.node: x for x in decide(view(a, CFG, owners=owners), CFG)}
    assert d["n2"].action == "leave" and "admin: DIMM" in d["n2"].why
    assert d["n3"].action == "watch"


def test_flapping_node_is_held_off() -> None:
    cfg = ControlSettings(max_flaps=2)
    log = []
    for k in range(3):
        log += [
            entry("control pass", ["n2"], NOW - 900 + 200 * k),
            entry("control pass", [], NOW - 800 + 200 * k),
        ]
    (d,) = decide(view(analysis(verdict("n2", "busy_time")), cfg, entries=log), cfg)
    assert d.action == "hold off" and "flapping" in d.why


def test_requeue_only_when_the_rule_says_so() -> None:
    impact = {"job": "j1", "pct": 20.0, "gpu_h_per_day": 38.4, "gpus": 8}
    a = analysis(verdict("n2", "busy_time", impact=impact))
    job = JobInfo(41, "train", "u", "RUNNING", ("n2",), requeue=True)
    owners = {"n2": ("quarantined", "")}
    cfg = ControlSettings(requeue=True)  # a restart: 900+300+300 s of 8 GPUs = 3.33 GPU-h
    early = [
        entry("control pass", ["n2"], NOW - 7200),  # 2 h x 20% x 8 GPUs = 3.2 GPU-h
        entry("quarantine", ["n2"], NOW - 7000, "done", by="control"),
    ]
    (d,) = decide(
        view(
            a, cfg, entries=early, owners=owners, running={"n2": [job]}, requeueable={41: 36000.0}
        ),
        cfg,
    )
    assert d.action == "wait" and "keep renting" in d.why
    log = [
        entry("control pass", ["n2"], NOW - 9000),  # 2.5 h: 4.0 GPU-h, past the price
        entry("quarantine", ["n2"], NOW - 7000, "done", by="control"),
    ]
    (d,) = decide(
        view(a, cfg, entries=log, owners=owners, running={"n2": [job]}, requeueable={41: 36000.0}),
        cfg,
    )
    assert (d.action, d.job, d.rung) == ("requeue", 41, "d")
    assert d.evidence["rental"]["price_gpu_h"] == 3.333
    (d,) = decide(
        view(a, cfg, entries=log, owners=owners, running={"n2": [job]}, requeueable={41: 600.0}),
        cfg,
    )
    assert d.action == "wait" and "let it finish" in d.why
    (d,) = decide(view(a, cfg, entries=log, owners=owners, running={"n2": [job]}), cfg)
    assert d.action == "wait"  # not requeue-able
    off = ControlSettings(requeue=False)
    (d,) = decide(
        view(a, off, entries=log, owners=owners, running={"n2": [job]}, requeueable={41: 36000.0}),
        off,
    )
    assert d.action == "wait"


def test_a_heavy_pipeline_stage_is_reported_and_a_node_fault_in_it_still_acted_on() -> None:
    from guardctl.analyze.stages import StageImbalance

    heavy = StageImbalance("j1", 3, ("n7", "n8"), 1.25, 3)
    base = analysis(verdict("n8", "busy_time"))
    a = Analysis(base.window_start, base.window_end, base.nodes, stages=(heavy,))
    classified = classify(a, CFG)
    (stage,) = classified.fleet
    assert (stage.scope, stage.name, stage.nodes, stage.of) == (
        "stage",
        "j1/stage3",
        ("n7", "n8"),
        8,
    )
    assert "layer split" in stage.why
    # n8 is slow against its own stage's peers: still its node fault.
    (d,) = decide(view(a, CFG), CFG)
    assert (d.node, d.action) == ("n8", "quarantine")
    # The stage alone: reported, no node action.
    quiet = Analysis(base.window_start, base.window_end, analysis().nodes, stages=(heavy,))
    assert decide(view(quiet, CFG), CFG) == [] and classify(quiet, CFG).fleet


def test_rung_a_only_for_the_served_job_running_on_the_node_with_step_records() -> None:
    impact = {
        "job": "41",
        "pct": 25.0,
        "gpu_h_per_day": 96.0,
        "gpus": 16,
        "step_s": 12.0,
        "step_s_without": 9.0,
    }
    a = analysis(verdict("n2", "busy_time", job="41", impact=impact), job="41")
    job = JobInfo(41, "train", "u", "RUNNING", ("n1", "n2"))
    running = {"n2": [job]}
    (d,) = decide(view(a, CFG, running=running, dds_jobs=frozenset({"41"}), data_end=NOW), CFG)
    assert (d.action, d.rung) == ("rebalance", "a")
    assert d.evidence["rebalance"]["step_s"] == 12.0 and "10.5 s" in d.why  # recovered at <= 10.5
    # The service serves another job, or the job no longer runs there: the ladder as ever.
    (d,) = decide(view(a, CFG, running=running, dds_jobs=frozenset({"7"})), CFG)
    assert (d.action, d.rung) == ("quarantine", "b")
    (d,) = decide(view(a, CFG, dds_jobs=frozenset({"41"})), CFG)
    assert (d.action, d.rung) == ("quarantine", "b")
    # No step records: nothing to check the job's recovery on, so no rung a.
    bare = analysis(verdict("n2", "busy_time", job="41"), job="41")
    (d,) = decide(view(bare, CFG, running=running, dds_jobs=frozenset({"41"})), CFG)
    assert d.action == "quarantine" and "nothing to check its recovery on" in d.why


def test_rung_a_watch_from_the_log_recovers_or_times_out_from_values() -> None:
    cfg = ControlSettings(recovery=0.5, rebalance_window_s=600.0)
    job = JobInfo(41, "train", "u", "RUNNING", ("n2",))
    watch = {
        "phase": "watch",
        "job": "41",
        "since": NOW - 300,
        "step_s": 12.0,
        "step_s_without": 9.0,
        "data_end": NOW - 300,
        "why": "watching",
    }

    def now_at(step_s: float, since: float = NOW - 300) -> tuple[str, str, dict]:
        impact = {"job": "41", "step_s": step_s, "step_s_without": 9.0, "pct": 1, "gpus": 8}
        a = analysis(verdict("n2", "busy_time", job="41", impact=impact), job="41")
        # as record_rebalance writes it ("phase" is the evidence's, not the entry's)
        entries = [
            Entry(
                "w", since, "control rebalance", "note", ("n2",), evidence={**watch, "since": since}
            )
        ]
        (d,) = decide(
            view(
                a,
                cfg,
                entries=entries,
                running={"n2": [job]},
                dds_jobs=frozenset({"41"}),
                data_end=NOW,
            ),
            cfg,
        )
        return d.action, d.evidence.get("rebalance", {}).get("phase", ""), d.evidence

    assert now_at(10.5)[:2] == ("rebalance", "recovered")  # half the 3 s won back
    assert now_at(10.6)[:2] == ("rebalance", "watch")  # not yet, still in time
    action, phase, evidence = now_at(10.6, since=NOW - 601)
    assert (action, phase) == ("quarantine", "not recovered")
    assert evidence["rebalance"]["won_back_pct"] == 46.7


def test_a_node_whose_sweep_runs_waits_on_it_until_its_verdict() -> None:
    a = analysis(verdict("n2", "busy_time"))
    owners = {"n2": ("quarantined", "reservation guardctl_q_n2")}
    log = [
        entry("quarantine", ["n2"], NOW - 60, "done", by="control"),
        entry("control sweeping", ["n2"], NOW - 30, sweep="S1"),
    ]
    (d,) = decide(view(a, CFG, entries=log, owners=owners), CFG)
    assert (d.action, d.rung, d.evidence["sweep"]) == ("wait", "c", "S1") and "S1 runs" in d.why
    aborted = [*log, entry("control sweep", ["n2"], NOW - 10, verdict="aborted", sweep="S1")]
    (d,) = decide(view(a, CFG, entries=aborted, owners=owners), CFG)
    assert d.action == "sweep"  # closed (here aborted): the node is swept afresh
