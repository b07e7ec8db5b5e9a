"""Inputs a production store holds sooner or later: telemetry that stopped days ago, a node whose
clock runs hours ahead, a node name Slurm does not know, a node Slurm refuses a change to.
guardctl does nothing to Slurm on what it cannot be sure of, says why in one line, and every
other node's decision goes on. Each test looks at Slurm and at the action log afterwards."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from controltools import Trace, fleet_trace

from guardctl.analyze.engine import Analysis, analyze
from guardctl.analyze.incremental import Analyzer
from guardctl.config import load_settings
from guardctl.controller.loop import Controller
from guardctl.errors import SlurmError, SlurmUnavailable, UsageError
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest
from guardctl.storage import layout
from guardctl.telemetry import schema

NODES = ["node1", "node2", "node3", "node4", "node5", "node6"]
NODE_ACTIONS = {"quarantine", "unquarantine", "drain", "resume", "reserve", "unreserve"}


def controller(
    store: Path, slurm: MemorySlurm, lines: list[str] | None = None, **control: object
) -> Controller:
    settings = load_settings(environ={"GUARDCTL_STORE": str(store)})
    # Two flagged nodes of six are two node faults here, not a fleet-wide cause.
    control = {"max_fleet_fraction": 0.5, "max_job_fraction": 0.5, **control}
    settings = dataclasses.replace(
        settings, control=dataclasses.replace(settings.control, **control)
    )  # type: ignore[arg-type]
    progress = lines.append if lines is not None else (lambda _m: None)
    return Controller(settings, act=True, slurm=slurm, progress=progress)


def old_trace(store: Path, names: list[str], slow: dict[str, float], end: float) -> Trace:
    """A job on *names* whose telemetry ended at *end* (nothing written since)."""
    tr = Trace(store, nodes=len(names), minutes=20, seed=7)
    tr.names = list(names)
    tr.t = tr.t - tr.t[-1] + end
    for node, factor in slow.items():
        tr.slow[tr.at(2) :, tr.node(node), 3] = factor
    tr.write()
    return tr


def one_record_ahead(store: Path, tr: Trace, node: str, ahead_s: float) -> float:
    """One host record of *node* stamped *ahead_s* after now, in its hour's file (as an agent
    whose clock is ahead writes it)."""
    rec = next(r for r in reversed(tr.records()) if r["node"] == node and r["kind"] == "host")
    ts = round(time.time() + ahead_s, 3)
    rec = {**rec, "ts": ts}
    path = layout.node_telemetry_file(store, node, ts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(schema.dumps(rec) + "\n")
    return ts


def acted(c: Controller, nodes: Sequence[str] | None = None) -> list[tuple[str, str, tuple]]:
    """The node actions in the log: (action, phase, nodes)."""
    return [
        (e.action, e.phase, e.nodes)
        for e in c.ops.log.entries()
        if e.action in NODE_ACTIONS and (nodes is None or set(e.nodes) & set(nodes))
    ]


def busy(slurm: MemorySlurm, node: str) -> int:
    """A production job on *node*: a quarantine then waits for it rather than sweeping."""
    job = slurm.submit(SubmitRequest("train.sbatch", nodes=(node,), job_name="train"))
    slurm.advance(1)
    return job


# -- stale telemetry ----------------------------------------------------------------------------


def test_telemetry_three_days_old_changes_nothing_and_the_next_fresh_pass_acts(
    tmp_path: Path,
) -> None:
    old_trace(tmp_path, NODES, {"node2": 1.3}, end=time.time() - 3 * 86400)
    slurm = MemorySlurm(NODES, start=time.time())
    busy(slurm, "node2")
    lines: list[str] = []
    c = controller(tmp_path, slurm, lines)
    report = c.run_pass()
    assert slurm.reservations() == [] and not any(n.drained for n in slurm.nodes())
    assert acted(c) == []
    assert [f["node"] for f in report.findings] == ["node2"]  # what it saw, reported
    assert "stale telemetry" in report.refused and "3.0 days ago" in report.refused
    assert report.decisions == []
    assert not [e for e in c.ops.log.entries() if e.action.startswith("control")]
    said = [line for line in lines if "stale telemetry" in line]
    assert len(said) == 1 and "\n" not in said[0] and "next pass carries on" in said[0]

    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})  # the agents write again
    report = c.run_pass()
    assert report.refused == ""
    (d,) = [d for d in report.decisions if d["node"] == "node2"]
    assert (d["decision"], d["outcome"]) == ("quarantine", "done")
    assert [r.nodes for r in slurm.reservations()] == [("node2",)]
    assert acted(c) == [("quarantine", "intent", ("node2",)), ("quarantine", "done", ("node2",))]


def test_a_daemon_over_stale_telemetry_says_so_each_pass_and_acts_on_none(tmp_path: Path) -> None:
    old_trace(tmp_path, NODES, {"node2": 1.3}, end=time.time() - 3 * 86400)
    slurm = MemorySlurm(NODES, start=time.time())
    lines: list[str] = []
    c = controller(tmp_path, slurm, lines)
    c.as_daemon(60.0)
    reports = [c.run_pass() for _ in range(2)]
    assert slurm.reservations() == [] and acted(c) == []
    assert all("stale telemetry" in r.refused for r in reports)
    assert len([line for line in lines if "stale telemetry" in line]) == 2


def test_the_one_off_analyze_warns_of_a_stale_window(tmp_path: Path) -> None:
    old_trace(tmp_path, NODES, {"node2": 1.3}, end=time.time() - 3 * 86400)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARDCTL")}
    env["GUARDCTL_STORE"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "guardctl", "analyze"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # the verdicts, reported all the same
    (warning,) = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert warning.startswith("guardctl: warning: stale telemetry: the newest window ended 3.0")
    assert "node2" in proc.stdout


# -- a clock ahead ------------------------------------------------------------------------------


def test_one_record_two_hours_ahead_neither_moves_the_window_nor_hides_a_fault(
    tmp_path: Path,
) -> None:
    tr = fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    end = float(tr.t[-1])
    stamped = one_record_ahead(tmp_path, tr, "node5", 7200.0)
    settings = load_settings(environ={"GUARDCTL_STORE": str(tmp_path)})
    cold = analyze(None, settings)
    assert abs(cold.window_end - end) < 1.0, "the window moved"
    assert cold.verdict_of("node2").verdict == "suspect"  # type: ignore[union-attr]
    assert cold.ahead == {"node5": stamped}
    steady = Analyzer(settings).analyze()  # the controller's reader: the same answer
    assert json.dumps(steady.to_dict(), sort_keys=True) == json.dumps(
        cold.to_dict(), sort_keys=True
    )

    slurm = MemorySlurm(NODES, start=time.time())
    busy(slurm, "node2")
    lines: list[str] = []
    c = controller(tmp_path, slurm, lines)
    report = c.run_pass()
    assert report.refused == "" and report.ahead == {"node5": stamped}
    (said,) = [line for line in lines if "ahead" in line]
    assert "1 node(s) stamp records up to 2.0 h ahead" in said and "node5" in said
    (d,) = [d for d in report.decisions if d["node"] == "node2"]
    assert (d["decision"], d["outcome"]) == ("quarantine", "done")
    assert [r.nodes for r in slurm.reservations()] == [("node2",)]
    assert acted(c, ["node5"]) == []


def test_every_agent_an_hour_ahead_is_judged_on_nothing(tmp_path: Path) -> None:
    """Every agent's clock an hour ahead of this host's: no record is current, nothing is
    judged or done, and the nodes are named."""
    tr = old_trace(tmp_path, NODES, {"node2": 1.3}, end=time.time() + 3600)
    slurm = MemorySlurm(NODES, start=time.time())
    busy(slurm, "node2")
    lines: list[str] = []
    c = controller(tmp_path, slurm, lines)
    report = c.run_pass()
    assert slurm.reservations() == [] and acted(c) == []
    assert sorted(report.ahead) == NODES and report.findings == [] and report.decisions == []
    assert max(report.ahead.values()) == pytest.approx(float(tr.t[-1]) + 0.1, abs=1.0)
    (said,) = [line for line in lines if "ahead" in line]
    assert said.startswith("control: 6 node(s) stamp records up to 1.0 h ahead")


def test_a_window_is_current_only_between_two_windows_ago_and_the_tolerance() -> None:
    from guardctl.analyze.engine import out_of_date

    now = 1_800_000_000.0

    def window(end: float) -> Analysis:
        return Analysis(end - 300.0, end, ())

    assert out_of_date(window(now), now, 120.0) is None
    assert out_of_date(window(now + 120.0), now, 120.0) is None
    assert out_of_date(window(now - 720.0), now, 120.0) is None  # 2 windows + the tolerance
    assert out_of_date(Analysis(math.nan, math.nan, ()), now, 120.0) is None  # no data at all
    future = out_of_date(window(now + 900.0), now, 120.0)
    assert future is not None and future.startswith("the newest window ends 900 s after")
    stale = out_of_date(window(now - 721.0), now, 120.0)
    assert stale == (
        "stale telemetry: the newest window ended 721 s ago (more than 2 windows of 300 s)"
    )


# -- nodes Slurm does not know, and one node's error ---------------------------------------------


def test_a_node_unknown_to_slurm_is_left_alone_and_the_others_go_on(tmp_path: Path) -> None:
    fleet_trace(tmp_path, [*NODES, "ghost"], slow={"ghost": 1.3, "node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())  # no "ghost" in Slurm
    busy(slurm, "node2")
    c = controller(tmp_path, slurm)
    report = c.run_pass()
    by_node = {d["node"]: d for d in report.decisions}
    assert by_node["ghost"]["decision"] == "leave"
    assert "unknown to Slurm" in by_node["ghost"]["why"]
    assert (by_node["node2"]["decision"], by_node["node2"]["outcome"]) == ("quarantine", "done")
    assert [r.nodes for r in slurm.reservations()] == [("node2",)]
    assert acted(c, ["ghost"]) == []
    assert [
        e.nodes
        for e in c.ops.log.entries()
        if e.action == "control decision" and e.evidence["decision"] == "leave"
    ] == [("ghost",)]
    c.run_pass()  # and again: nothing stalls
    explained = c.explain("ghost")
    assert explained["owner"][0] == "unknown to Slurm"
    assert explained["decision"]["decision"] == "leave"
    assert "unknown to Slurm" in explained["decision"]["why"]
    with pytest.raises(UsageError, match="unknown node"):
        c.explain("nosuch")  # neither Slurm's nor the telemetry's: a usage error, as before


class RefusingSlurm(MemorySlurm):
    """Slurm refusing a reservation on some nodes (or not answering at all)."""

    def __init__(self, names: list[str], refuse: dict[str, Exception]) -> None:
        super().__init__(names, start=time.time())
        self.refuse = refuse

    def create_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        users: Sequence[str],
        flags: Sequence[str] = ("MAINT", "IGNORE_JOBS"),
    ) -> None:
        for node in nodes:
            if node in self.refuse:
                raise self.refuse[node]
        super().create_reservation(name, nodes, users, flags)


def test_one_decisions_slurm_error_does_not_stop_the_others(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node1": 1.3, "node2": 1.3})
    slurm = RefusingSlurm(
        NODES,
        {
            "node1": SlurmError(
                "scontrol failed: Error creating the reservation: Requested nodes are busy"
            )
        },
    )
    busy(slurm, "node1")
    busy(slurm, "node2")
    c = controller(tmp_path, slurm)
    by_node = {d["node"]: d for d in c.run_pass().decisions}
    assert by_node["node1"]["outcome"].startswith("failed: scontrol failed")
    assert (by_node["node2"]["decision"], by_node["node2"]["outcome"]) == ("quarantine", "done")
    assert [r.nodes for r in slurm.reservations()] == [("node2",)]
    assert ("quarantine", "done", ("node2",)) in acted(c)
    assert ("quarantine", "done", ("node1",)) not in acted(c)


def test_slurm_down_still_stops_the_pass(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node1": 1.3, "node2": 1.3})
    slurm = RefusingSlurm(NODES, {"node1": SlurmUnavailable("scontrol: timed out after 30 s")})
    busy(slurm, "node1")
    busy(slurm, "node2")
    c = controller(tmp_path, slurm)
    with pytest.raises(SlurmUnavailable):
        c.run_pass()
    assert slurm.reservations() == []  # node2 comes after: not reached, next pass reconciles
