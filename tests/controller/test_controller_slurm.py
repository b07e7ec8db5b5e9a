"""The controller on the local Slurm lab: real slurmctld, real jobs, guardctl as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from controltools import Guardctl, control_guardctl, fleet_trace

NODES = ["node1", "node2", "node3", "node4"]


def held_job(
    lab: Any, tmp_path: Path, nodes: str, *extra: str, elsewhere: str = ""
) -> tuple[str, Path]:
    """A running job on *nodes* that ends when its stop file appears (with *elsewhere*: kept
    off those nodes by --exclude instead of pinned, so that it may run elsewhere later)."""
    stop = tmp_path / f"stop-{nodes}"
    script = f"#!/bin/bash\nwhile [ ! -e {stop} ]; do sleep 0.3; done\n"
    where = ("-x", elsewhere) if elsewhere else ("-w", nodes)
    job = lab.submit(script, "-N", str(len(nodes.split(","))), *where, "-o", "/dev/null", *extra)
    deadline = time.monotonic() + 30
    while lab.job_info(job).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, lab.job_info(job)
        time.sleep(0.2)
    return job, stop


def learn_baselines(g: Guardctl) -> None:
    """Sweep two healthy nodes once, so that a lone node's sweep has a baseline to meet."""
    proc = g("sweep", "node[3-4]", "--kind", "single", "--duration", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def control(g: Guardctl, *args: str, timeout: float = 180) -> dict[str, Any]:
    proc = g("control", "--once", "--json", *args, timeout=timeout)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


def decision(report: dict[str, Any], node: str) -> dict[str, Any]:
    return next(d for d in report["decisions"] if d["node"] == node)


def reservations(lab: Any) -> str:
    return str(lab.sh("scontrol", "show", "reservation").stdout)


def settled(lab: Any, timeout: float = 60) -> None:
    """Wait until no node is "not responding" (sinfo's '*') or of unknown state."""
    deadline = time.monotonic() + timeout
    while any(s.endswith("*") or s.startswith("unk") for s in lab.states().values()):
        assert time.monotonic() < deadline, lab.states()
        time.sleep(0.3)


def entries(g: Guardctl) -> list[dict[str, Any]]:
    out = g("history", "--json", "--limit", "1000")
    return list(json.loads(out.stdout)["entries"])


def test_grey_node_in_a_running_job_is_quarantined_then_swept_and_drained(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab, sweep="inject = { node2 = 0.1 }\n")
    learn_baselines(g)
    job, stop = held_job(lab, tmp_path, "node1,node2")
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    first = control(g, "--act")
    d = decision(first, "node2")
    assert (d["decision"], d["rung"], d["outcome"]) == ("quarantine", "b", "done"), d
    assert int(job) in d["jobs"]
    assert "guardctl_q_node2" in reservations(lab)
    assert lab.job_info(job)["JobState"] == "RUNNING"  # the job goes on undisturbed
    assert [x["node"] for x in first["decisions"]] == ["node2"]  # the others: nothing
    waiting = decision(control(g, "--act"), "node2")
    assert waiting["decision"] == "wait" and "waiting for job" in waiting["why"]
    assert lab.job_info(job)["JobState"] == "RUNNING"
    stop.touch()
    lab.wait_job(job, timeout=30)
    swept = decision(control(g, "--act"), "node2")
    assert swept["decision"] == "sweep" and swept["outcome"] == "swept: fail, drained", swept
    state = lab.node_state("node2")
    assert "DRAIN" in state["state_flags"] and state["reason"].startswith("guardctl: sweep ")
    assert "guardctl_q_node2" not in reservations(lab)
    # Every decision is in the history with its evidence; explain says why.
    decisions = [e for e in entries(g) if e["action"] == "control decision"]
    assert [e["evidence"]["decision"] for e in decisions] == ["quarantine", "wait", "sweep"]
    assert decisions[0]["evidence"]["impact"]["pct"] > 5
    explained = json.loads(g("control", "--explain", "node2", "--json").stdout)
    assert explained["owner"][0] == "drained by guardctl"
    assert [s["verdict"] for s in explained["ladder"]["sweeps"]] == ["fail"]


def test_a_false_suspect_is_released_and_a_relapsing_one_drained_as_a_lemon(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab, control="relapses = 2\nrelapse_sweep_factor = 1.5\n")
    fleet_trace(g.store, NODES, slow={"node3": 1.3})
    first = decision(control(g, "--act"), "node3")
    assert first["decision"] == "quarantine" and first["outcome"] == "swept: pass, released"
    assert "guardctl_q_node3" not in reservations(lab)
    # The same data again: it predates the pass, so it is no relapse.
    again = decision(control(g, "--act"), "node3")
    assert again["decision"] == "none" and "before its sweep passed" in again["why"]
    fleet_trace(g.store, NODES, slow={"node3": 1.3})  # flagged anew: relapse 1
    relapse = decision(control(g, "--act"), "node3")
    assert (relapse["decision"], relapse["rung"]) == ("quarantine", "e"), relapse
    assert relapse["outcome"] == "swept: pass, released"
    sweeps = [e for e in entries(g) if e["action"] == "control sweep"]
    assert [s["evidence"]["duration_s"] for s in sweeps] == [2.0, 3.0]  # the relapse: longer
    fleet_trace(g.store, NODES, slow={"node3": 1.3})  # relapse 2: a lemon
    lemon = decision(control(g, "--act"), "node3")
    # Its last, longest sweep passes, and it is drained for repair all the same.
    assert (lemon["decision"], lemon["outcome"]) == (
        "quarantine",
        "swept: pass, drained as a lemon",
    ) and "lemon" in lemon["why"], lemon
    sweeps = [e for e in entries(g) if e["action"] == "control sweep"]
    assert [s["evidence"]["duration_s"] for s in sweeps] == [2.0, 3.0, 4.5]
    assert "guardctl_q_node3" not in reservations(lab)  # drained first, then the reservation gone
    state = lab.node_state("node3")
    assert "DRAIN" in state["state_flags"] and "lemon" in state["reason"]


def test_a_whole_fleet_flagged_at_once_is_one_finding_and_no_node_action(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab)
    fleet_trace(g.store, NODES, hw_slowdown=NODES)
    report = control(g, "--act")
    assert len(report["fleet"]) == 1 and report["fleet"][0]["scope"] == "fleet"
    assert {d["decision"] for d in report["decisions"]} == {"none"}
    assert "guardctl_" not in reservations(lab)
    assert not [e for e in entries(g) if e["action"] in ("quarantine", "drain")]
    control(g, "--act")  # the same finding again is not recorded again
    assert len([e for e in entries(g) if e["action"] == "control fleet"]) == 1


def test_an_administrators_drain_and_reservation_are_untouched(lab: Any, tmp_path: Path) -> None:
    g = control_guardctl(tmp_path, lab, control="max_fleet_fraction = 1.0\n")
    lab.sh("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=admin: DIMM")
    lab.sh(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=admin_maint",
        "Nodes=node3",
        "Users=root",
        "StartTime=now",
        "Duration=60",
        "Flags=MAINT,IGNORE_JOBS",
    )
    fleet_trace(g.store, NODES, slow={"node2": 1.3, "node3": 1.3})
    report = control(g, "--act")
    for node in ("node2", "node3"):
        d = decision(report, node)
        assert d["decision"] == "leave" and "someone else" in d["why"], d
    assert lab.node_state("node2")["reason"] == "admin: DIMM"
    assert "guardctl_" not in reservations(lab) and "admin_maint" in reservations(lab)


def test_observe_only_changes_nothing_and_records_what_it_would_do(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab)
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    proc = g("control", "--once")
    assert proc.returncode == 1, proc.stderr
    assert "observe only" in proc.stdout and "node2" in proc.stdout
    assert "costs job j1" in proc.stdout
    assert "guardctl_" not in reservations(lab)
    assert lab.states()["node2"] == "idle"
    (rec,) = [e for e in entries(g) if e["action"] == "control decision"]
    assert rec["evidence"]["decision"] == "quarantine"
    assert rec["evidence"]["outcome"] == "would do"
    assert not [e for e in entries(g) if e["action"] in ("quarantine", "drain", "release")]


def test_two_controllers_one_acts_and_the_other_takes_over_a_dead_leader(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab, control="interval_s = 0.5\n")
    _job, stop = held_job(lab, tmp_path, "node2")
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    procs = [g.popen("control", "--act") for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        lease = g.store / "control" / "lease.json"
        while not [e for e in entries(g) if e["action"] == "quarantine" and e["phase"] == "done"]:
            assert time.monotonic() < deadline, [p.poll() for p in procs]
            time.sleep(0.3)
        time.sleep(2)  # several passes of both
        quarantines = [e for e in entries(g) if e["action"] == "quarantine"]
        assert len({e["pid"] for e in quarantines}) == 1 and len(quarantines) == 2
        leader = json.loads(lease.read_text())["pid"]
        (first,) = [p for p in procs if p.pid == leader]
        (second,) = [p for p in procs if p.pid != leader]
        first.send_signal(signal.SIGKILL)
        first.wait()
        stop.touch()  # the job ends: the new leader sweeps the node
        while json.loads(lease.read_text())["pid"] != second.pid:
            assert time.monotonic() < deadline + 30
            time.sleep(0.3)
        while not [e for e in entries(g) if e["action"] == "control sweep"]:
            assert time.monotonic() < deadline + 90, second.poll()
            time.sleep(0.5)
        sweeps = [e for e in entries(g) if e["action"] == "control sweep"]
        assert {e["pid"] for e in sweeps} == {second.pid}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=30) for p in procs]
    assert "another controller leads" in outs[1][0] + outs[0][0]


def test_a_crash_between_quarantine_and_sweep_is_reconciled_next_pass(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab)
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    env = {**g.env, "GUARDCTL_TEST_CRASH": "quarantine:after-slurm"}
    proc = subprocess.run(
        g.cmd("control", "--once", "--act"), env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 99, proc.stderr  # killed after Slurm, before the log said done
    assert "guardctl_q_node2" in reservations(lab)
    d = decision(control(g, "--act"), "node2")
    assert d["decision"] == "sweep" and d["outcome"] == "swept: pass, released", d
    phases = [e["phase"] for e in entries(g) if e["action"] == "quarantine"]
    assert phases[:2] == ["intent", "reconciled"]
    assert "guardctl_" not in reservations(lab)


def _running(job: dict[str, Any]) -> bool:
    # squeue --json gives the state as a word on 22.05 and as a list of flags from 23.02 on.
    state = job["job_state"]
    return "RUNNING" in (state if isinstance(state, list) else [state])


def test_slurm_controller_stopped_mid_pass_exits_5_and_the_next_pass_carries_on(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab, control="sweep_duration_s = 15.0\n")
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    proc = g.popen("control", "--once", "--act")
    try:
        deadline = time.monotonic() + 60
        while not any(
            _running(j) and j["name"].startswith("guardctl-") for j in lab.squeue_json()["jobs"]
        ):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.3)
        lab.stop_controller()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        lab.start_controller()
    assert proc.returncode == 5, out + err
    assert err.count("guardctl: error:") == 1 and "Traceback" not in err
    assert "guardctl_q_node2" in reservations(lab)  # left quarantined: safe
    assert not [e for e in entries(g) if e["action"] == "release"]
    # Until its slurmd answers the restarted Slurm controller a node is not responding, and a
    # pass leaves it alone (held by someone else): wait for that, as an operator would.
    settled(lab)
    d = decision(control(g, "--act", timeout=240), "node2")
    assert d["decision"] == "sweep" and d["outcome"].startswith("swept: pass"), d


def test_requeue_rung_moves_a_requeueable_job_off_the_slow_node(lab: Any, tmp_path: Path) -> None:
    cheap = "requeue = true\ncheckpoint_interval_s = 0.0\nrestart_s = 0.0\nqueue_wait_s = 0.0\n"
    g = control_guardctl(tmp_path, lab, control=cheap)
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    kept, kept_stop = held_job(lab, tmp_path, "node1")  # on a healthy node: left alone
    job, stop = held_job(lab, tmp_path, "node2", "--requeue", "-t", "30", elsewhere="node1,node3")
    assert lab.job_info(job)["NodeList"] == "node2"
    first = decision(control(g, "--act"), "node2")
    assert first["decision"] == "quarantine"
    second = decision(control(g, "--act"), "node2")
    assert (second["decision"], second["rung"], second["outcome"]) == ("requeue", "d", "done")
    assert second["rental"]["requeue"] is True
    deadline = time.monotonic() + 60
    while True:
        info = lab.job_info(job)
        if info.get("JobState") == "RUNNING" and info.get("NodeList") != "node2":
            break
        assert time.monotonic() < deadline, info
        time.sleep(0.5)
    # guardctl's exclusion is added to the user's own, which the requeue keeps.
    assert info.get("NodeList") == "node4"
    assert lab.sh("scontrol", "show", "hostnames", info["ExcNodeList"]).stdout.split() == [
        "node1",
        "node2",
        "node3",
    ]
    assert int(info.get("Restarts", "0")) == 1
    assert lab.job_info(kept)["JobState"] == "RUNNING"
    stop.touch()
    kept_stop.touch()
    os.sync()


def _daemon(g: Guardctl, out: Path) -> subprocess.Popen[str]:
    """A controller daemon whose output goes to *out* (a pipe could fill and stall it)."""
    with out.open("a") as fh:
        return subprocess.Popen(
            g.cmd("control", "--act"),
            env=g.env,
            stdout=fh,
            stderr=fh,
            text=True,
            cwd=str(g.store.parent),
        )


def _until(what: str, check: Any, timeout: float, proc: subprocess.Popen[str]) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline and proc.poll() is None, what
        time.sleep(0.3)
    return found


def test_the_daemon_watches_the_fleet_during_a_sweep_and_a_restart_cleans_it_up(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(
        tmp_path,
        lab,
        control="sweep_duration_s = 15.0\ninterval_s = 1.0\n"
        "max_fleet_fraction = 1.0\nmax_job_fraction = 1.0\n",
    )

    def of(action: str, node: str, pid: int | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in entries(g)
            if e["action"] == action and node in e["nodes"] and pid in (None, e["pid"])
        ]

    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    first = _daemon(g, tmp_path / "first.log")
    try:
        _until("node2's sweep started", lambda: of("control sweeping", "node2"), 60, first)
        # node3 turns grey while node2's sweep runs: the daemon is not stuck in that sweep.
        fleet_trace(g.store, NODES, slow={"node2": 1.3, "node3": 1.3}, replace=True)
        _until("node3's sweep started", lambda: of("control sweeping", "node3"), 60, first)
        assert not of("control sweep", "node2"), "node3 waited for node2's sweep"
        first.send_signal(signal.SIGKILL)  # mid-sweep: its jobs run on, its state is lost
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    (orphan,) = of("control sweeping", "node3")
    jobs = [
        int(j)
        for e in entries(g)
        if e["action"] == "sweep jobs" and e["evidence"]["sweep"] == orphan["evidence"]["sweep"]
        for j in e["evidence"]["jobs"]
    ]
    assert jobs
    second = _daemon(g, tmp_path / "second.log")
    try:
        # The new daemon aborts what the dead one left (its jobs cancelled, node3 kept
        # quarantined), then sweeps both nodes itself to the end.
        for node in ("node2", "node3"):
            _until(
                f"{node} swept by the new daemon",
                lambda n=node: [  # type: ignore[misc]
                    e
                    for e in of("control sweep", n, second.pid)
                    if e["evidence"]["verdict"] == "pass"
                ],
                150,
                second,
            )
        aborted = [
            e
            for e in of("control sweep", "node3")
            if e["evidence"]["sweep"] == orphan["evidence"]["sweep"]
        ]
        assert [e["evidence"]["verdict"] for e in aborted] == ["aborted"]
        assert aborted[0]["pid"] == second.pid
        for job in jobs:
            assert lab.job_info(str(job)).get("JobState", "COMPLETED") in ("CANCELLED", "COMPLETED")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)
    assert "guardctl_" not in reservations(lab)  # nothing leaked: both released on passing
    assert {lab.states()[n] for n in ("node2", "node3")} == {"idle"}


def test_the_daemons_sweep_of_kind_all_runs_its_pairwise_rounds_across_passes(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(tmp_path, lab, control='sweep_kind = "all"\ninterval_s = 1.0\n')
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    proc = _daemon(g, tmp_path / "daemon.log")
    try:
        done = _until(
            "node2 swept",
            lambda: [e for e in entries(g) if e["action"] == "control sweep"],
            240,
            proc,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    log = (tmp_path / "daemon.log").read_text()
    assert [(e["evidence"]["verdict"], e["evidence"]["action"]) for e in done] == [
        ("pass", "released")
    ], log
    sweep = done[0]["evidence"]["sweep"]
    # GEMM and all-reduce, then the pairwise reference group and round, each a batch submitted
    # by one poll and read by a later one; each group's sweep reservation made and deleted once.
    batches = [
        e for e in entries(g) if e["action"] == "sweep jobs" and e["evidence"]["sweep"] == sweep
    ]
    tags = [t for e in batches for t in e["evidence"]["jobs"].values()]
    assert len(batches) >= 3 and any("pairwise-node2" in t for t in tags), log
    outputs = {p.stem for p in (g.store / "sweeps" / sweep).glob("*.out")}
    assert outputs == set(tags), outputs  # every job's output in its sweep's directory
    made = [e for e in entries(g) if e["action"] == "sweep reserve" and e["phase"] == "done"]
    gone = [e for e in entries(g) if e["action"] == "sweep unreserve" and e["phase"] == "done"]
    assert made and sorted(e["evidence"]["reservation"] for e in made) == sorted(
        e["evidence"]["reservation"] for e in gone
    ), log
    waits = [
        e
        for e in entries(g)
        if e["action"] == "control decision"
        and e["evidence"]["decision"] == "wait"
        and "its sweep" in e["reason"]
    ]
    assert waits, log  # the passes in between decided on, the node waiting on its sweep
    assert "guardctl_" not in reservations(lab) and lab.states()["node2"] == "idle"
