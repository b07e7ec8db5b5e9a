"""A job slowed on every rank alike (its own history says so, its peers cannot) reaches the
controller as a job-level finding with its cost: reported, recorded once, explained on its
nodes, and never a node action; the same job slowed by one node is that node's matter."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from click.testing import CliRunner
from controltools import Trace

from guardctl.actionlog import ActionLog
from guardctl.cli import main
from guardctl.config import load_settings
from guardctl.controller.loop import Controller
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest

NODES = ["node1", "node2", "node3", "node4"]


def job_trace(store: Path, slow: list[str]) -> None:
    """A 30-minute job on NODES whose telemetry ends now; the ranks on *slow* compute 1.5x
    longer for its last ten and a half minutes (two of its 5-minute windows)."""
    tr = Trace(store, nodes=len(NODES), minutes=30)
    tr.names = list(NODES)
    tr.t = tr.t - tr.t[-1] + time.time()
    for node in slow:
        tr.slow[tr.at(19.5) :, tr.node(node), :] = 1.5
    tr.write()


def controller(store: Path, slurm: MemorySlurm) -> Controller:
    settings = load_settings(environ={"GUARDCTL_STORE": str(store)})
    settings = dataclasses.replace(settings, control=dataclasses.replace(settings.control))
    return Controller(settings, act=True, slurm=slurm)


def test_a_job_slowed_on_every_rank_is_reported_with_its_cost_and_no_node_is_touched(
    tmp_path: Path,
) -> None:
    job_trace(tmp_path, slow=NODES)
    slurm = MemorySlurm(NODES, start=time.time())
    slurm.submit(SubmitRequest("train.sbatch", nodes=tuple(NODES), job_name="train"))
    slurm.advance(1)
    c = controller(tmp_path, slurm)
    for _ in range(2):  # recorded once, however many passes see it
        report = c.run_pass()
        (finding,) = report.fleet
        assert (finding["scope"], finding["name"], finding["nodes"]) == ("slowdown", "j1", NODES)
        assert "its own earlier pace" in finding["why"] and "not a node fault" in finding["why"]
        impact = finding["impact"]
        assert impact["job"] == "j1" and impact["gpus"] == 32 and impact["ratio"] > 1.25
        assert impact["s_per_step_lost"] > 3 and impact["gpu_h_lost"] > 0
        assert report.findings == []  # no node flagged: none at fault, none watched
        assert all(d["decision"] in ("none", "watch") for d in report.decisions), report.decisions
    assert slurm.reservations() == [] and not any(n.drained for n in slurm.nodes())
    entries = ActionLog(tmp_path).history(None, 1000)
    actions = [e.action for e in entries]
    assert actions.count("control fleet") == 1
    assert not {"quarantine", "drain", "release", "sweep"} & set(actions)
    (recorded,) = [e for e in entries if e.action == "control fleet"]
    assert recorded.evidence["scope"] == "slowdown" and recorded.evidence["impact"]["pct"] > 20
    explained = c.explain("node2")
    assert explained["finding"] is None and explained["decision"] is None
    assert [f["scope"] for f in explained["fleet"]] == ["slowdown"]
    env = {"GUARDCTL_STORE": str(tmp_path), "GUARDCTL_CONFIG": None}
    shown = CliRunner().invoke(main, ["history", "--control"], env=env)
    assert shown.exit_code == 0, shown.output
    (line,) = [ln for ln in shown.output.splitlines() if "control fleet" in ln]
    assert "its own earlier pace" in line and f"impact={impact['pct']}%" in line


def test_a_job_slowed_by_one_node_is_that_nodes_fault_not_the_jobs(tmp_path: Path) -> None:
    job_trace(tmp_path, slow=["node2"])
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm)
    c.acting = False  # what it would do is enough here (a free node would be swept)
    report = c.run_pass()
    assert report.fleet == []
    (d,) = [d for d in report.decisions if d["node"] == "node2"]
    assert (d["decision"], d["outcome"]) == ("quarantine", "would do")
