"""Fabric findings through the real controller over the in-memory Slurm, with the real analyzer
and classifier: a degraded leaf switch is one ``control fabric`` record and no node action; a
node fault under a healthy switch is still quarantined; ``[control] fabric_quarantine`` keeps
new jobs off the leaf's nodes (capped, intent first) and releases them when the leaf clears;
every surface (status, history, report, --explain, the Prometheus export) shows the finding."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from click.testing import CliRunner
from controltools import Trace
from prometheus_client.parser import text_string_to_metric_families

from guardctl.cli import main
from guardctl.clock import Clock
from guardctl.config import Layer, Settings, build_settings
from guardctl.controller.loop import Controller
from guardctl.errors import SlurmUnavailable
from guardctl.slurm.memory import MemorySlurm
from guardctl.storage import store as shared_store
from guardctl.topology import Switch, Topology

NODES = [f"node{i}" for i in range(1, 9)]
LEAF = NODES[:4]  # under switch s1; node5-8 under s2; both under s0
TREE = Topology(
    {
        "s1": Switch("s1", tuple(LEAF)),
        "s2": Switch("s2", tuple(NODES[4:])),
        "s0": Switch("s0", (), ("s1", "s2")),
    }
)


def telemetry(store: Path, *, leaf: bool = True, hw: tuple[str, ...] = ()) -> None:
    """A job on the eight nodes whose telemetry ends now: with *leaf*, every node under s1
    waits fifty times longer to send (xmit_wait) from the second minute; *hw*: GPUs in HW
    slowdown. Written afresh (what was there before goes)."""
    tr = Trace(store, nodes=len(NODES), minutes=20, seed=7)
    tr.names = list(NODES)
    tr.t = tr.t - tr.t[-1] + time.time()
    onset = tr.at(2)
    if leaf:
        wait = np.diff(tr.nic["xmit_wait"], axis=0, prepend=tr.nic["xmit_wait"][:1])
        wait[onset:, : len(LEAF), :] *= 50
        tr.nic["xmit_wait"] = np.cumsum(wait, 0)
    for node in hw:
        tr.gpu["clock_event_reasons"][onset:, tr.node(node), :] = 0x8
        tr.gpu["sm_clock_mhz"][onset:, tr.node(node), :] = 1200
    tr.write_afresh()


def settings(store: Path, **control: Any) -> Settings:
    return build_settings(
        [
            Layer(
                "test",
                {
                    "store": {"root": str(store)},
                    "safety": {"max_out_fraction": 0.5},
                    "control": {"sweep_kind": "single", "align": False, **control},
                },
            )
        ]
    )


def cluster(tree: Topology | None = TREE) -> MemorySlurm:
    slurm = MemorySlurm(NODES, start=time.time())
    slurm.tree = tree
    return slurm


def controller(store: Path, slurm: MemorySlurm, act: bool = True, **control: Any) -> Controller:
    """The controller as its daemon runs it (a sweep started by one pass, polled by the next)."""
    c = Controller(settings(store, **control), act=act, slurm=slurm)
    c.as_daemon(10.0)
    return c


class Later(Clock):
    """This host's clocks, the monotonic one moved on by hand."""

    passed = 0.0

    def mono(self) -> float:
        return super().mono() + self.passed


def fabric_log(c: Controller) -> list[tuple[str, Any]]:
    return [
        (str(e.evidence.get("phase")), e.evidence.get("component"))
        for e in c.ops.log.entries()
        if e.action == "control fabric"
    ]


def cli(store: Path, *args: str) -> str:
    res = CliRunner().invoke(main, list(args), env={"GUARDCTL_STORE": str(store)})
    assert res.exit_code in (0, 1), res.output
    return res.output


def test_a_degraded_leaf_is_one_fabric_record_and_no_node_action(tmp_path: Path) -> None:
    telemetry(tmp_path)
    slurm = cluster()
    c = controller(tmp_path, slurm)
    first = c.run_pass()
    assert first.topology.startswith("slurm: 2 leaf switch(es)"), first.topology
    (found,) = first.fabric
    assert (found["component"], found["kind"], found["nodes"]) == ("leaf:s1", "leaf", LEAF)
    assert found["evidence_for"] and found["settle"] and 0 < found["confidence"] <= 1
    assert {d["node"]: d["decision"] for d in first.decisions} == dict.fromkeys(LEAF, "none")
    assert all("leaf:s1" in d["why"] for d in first.decisions)
    assert first.fleet == []  # the switch named, not "4 of the fleet's nodes at once"
    c.run_pass()
    c.run_pass()
    assert fabric_log(c) == [("open", "leaf:s1")]  # once while it lasts, not every pass
    assert slurm.reservations() == [] and not any(n.drained for n in slurm.nodes())
    assert not [j for j in slurm.jobs()]  # no sweep either
    assert not [e for e in c.ops.log.entries() if e.phase == "intent"]


def test_a_node_fault_under_a_healthy_switch_is_still_a_node_fault(tmp_path: Path) -> None:
    telemetry(tmp_path, hw=("node6",))
    slurm = cluster()
    c = controller(tmp_path, slurm)
    report = c.run_pass()
    got = {d["node"]: (d["decision"], d["outcome"]) for d in report.decisions}
    assert got["node6"][0] == "quarantine" and got["node6"][1].startswith(("done", "sweep"))
    assert {got[n][0] for n in LEAF} == {"none"}
    assert {n for r in slurm.reservations() for n in r.nodes} == {"node6"}


def test_a_single_node_fault_is_not_taken_for_its_switch(tmp_path: Path) -> None:
    telemetry(tmp_path, leaf=False, hw=("node2",))
    c = controller(tmp_path, cluster())
    report = c.run_pass()
    assert report.fabric == []
    (d,) = report.decisions
    assert (d["node"], d["decision"]) == ("node2", "quarantine")


def test_fabric_quarantine_keeps_jobs_off_then_releases_when_the_leaf_clears(
    tmp_path: Path,
) -> None:
    telemetry(tmp_path)
    slurm = cluster()
    c = controller(tmp_path, slurm, fabric_quarantine=True)
    report = c.run_pass()
    assert report.fabric[0]["quarantine"]["outcome"] == "done: 4 node(s) quarantined"
    held = {n for r in slurm.reservations() for n in r.nodes}
    assert held == set(LEAF)
    entries = c.ops.log.entries()
    intents = [e for e in entries if e.action == "quarantine" and e.phase == "intent"]
    assert {n for e in intents for n in e.nodes} == set(LEAF)
    assert all(e.evidence["fabric"] == "leaf:s1" and e.evidence["by"] == "control" for e in intents)
    for e in intents:  # each intent logged before its outcome
        done = next(d for d in entries if d.id == e.id and d.phase == "done")
        assert entries.index(done) > entries.index(e)
    second = c.run_pass()  # they wait unswept while the leaf is at fault
    assert {d["node"]: d["decision"] for d in second.decisions} == dict.fromkeys(LEAF, "wait")
    assert not slurm.jobs()

    telemetry(tmp_path, leaf=False)  # the switch repaired
    c.lease.release()
    c = controller(tmp_path, slurm, fabric_quarantine=True)
    cleared = c.run_pass()
    assert cleared.fabric == []
    assert {(d["node"], d["decision"], d["outcome"]) for d in cleared.decisions} == {
        (n, "release", "done") for n in LEAF
    }
    assert slurm.reservations() == []
    assert fabric_log(c) == [
        ("open", "leaf:s1"),
        ("quarantine", "leaf:s1"),
        ("cleared", "leaf:s1"),
    ]
    c.run_pass()
    assert len(fabric_log(c)) == 3 and slurm.reservations() == []


def test_fabric_quarantine_is_refused_whole_by_the_cap_and_said_once(tmp_path: Path) -> None:
    telemetry(tmp_path)
    slurm = cluster()
    s = build_settings(
        [
            Layer(
                "test",
                {
                    "store": {"root": str(tmp_path)},
                    "safety": {"max_out_nodes": 3},
                    "control": {"sweep_kind": "single", "align": False, "fabric_quarantine": True},
                },
            )
        ]
    )
    assert s.safety.max_out_nodes == 3
    c = Controller(s, act=True, slurm=slurm)
    c.as_daemon(10.0)
    outcome = c.run_pass().fabric[0]["quarantine"]["outcome"]
    assert outcome.startswith("refused: cap: guardctl would hold 4 node(s)"), outcome
    c.run_pass()
    assert slurm.reservations() == []
    assert fabric_log(c) == [("open", "leaf:s1"), ("quarantine", "leaf:s1")]


def test_observe_only_notes_the_finding_and_would_quarantine(tmp_path: Path) -> None:
    telemetry(tmp_path)
    slurm = cluster()
    c = controller(tmp_path, slurm, False, fabric_quarantine=True)
    report = c.run_pass()
    assert report.fabric[0]["quarantine"]["outcome"] == "would do"
    assert slurm.reservations() == []
    assert fabric_log(c) == [("open", "leaf:s1"), ("quarantine", "leaf:s1")]


def test_a_tree_slurm_cannot_give_leaves_the_pass_on_racks_alone_said_once(
    tmp_path: Path,
) -> None:
    telemetry(tmp_path)
    slurm = cluster()
    lines: list[str] = []

    def down() -> Topology | None:
        raise SlurmUnavailable("scontrol show topology: timed out after 10 s")

    slurm.topology = down  # type: ignore[method-assign]
    clock = Later()
    c = Controller(settings(tmp_path), act=True, slurm=slurm, progress=lines.append, clock=clock)
    c.as_daemon(10.0)
    report = c.run_pass()
    assert report.topology.startswith("cannot read the network tree from Slurm")
    assert report.fabric == []
    assert [f["scope"] for f in report.fleet] == ["fleet"]  # as before: a common cause
    clock.passed += 120  # past the tree's cache: read (and failed) again
    c.run_pass()
    assert len([m for m in lines if "network tree" in m]) == 1, lines
    # with [control] racks the tree is the racks', and Slurm is not asked
    c.lease.release()
    r = controller(tmp_path, slurm, racks={"r1": "node[1-4]", "r2": "node[5-8]"})
    assert r.run_pass().fabric[0]["component"] == "leaf:r1"


def test_every_surface_shows_the_fabric_finding(tmp_path: Path) -> None:
    telemetry(tmp_path, hw=("node6",))
    slurm = cluster()
    c = controller(tmp_path, slurm, fabric_quarantine=True)
    c.run_pass()

    status = json.loads(_status(tmp_path, slurm, "--json"))
    (f,) = status["fabric"]
    assert (f["component"], f["nodes"], f["quarantined"]) == ("leaf:s1", LEAF, LEAF)
    assert "fabric leaf:s1 at fault" in _status(tmp_path, slurm)

    hist = cli(tmp_path, "history", "--control")
    assert "control fabric" in hist and "component=leaf:s1" in hist
    assert "fabric=leaf:s1" in hist  # the quarantines taken for it
    entries = json.loads(cli(tmp_path, "history", "--control", "--json"))["entries"]
    assert any(e["action"] == "control fabric" for e in entries)

    explain = c.explain_component("leaf:s1")
    assert explain["state"] == "open" and explain["finding"]["evidence_for"]
    assert [n["node"] for n in explain["nodes"]] == LEAF
    assert all(n["fabric_quarantine"] for n in explain["nodes"])
    assert c.explain("node2")["fabric"][0]["component"] == "leaf:s1"
    assert c.explain_component("leaf:s2")["state"] == "not at fault"

    shared_store.init(tmp_path)  # what the administrator does once, at install time
    c.lease.release()
    with mock.patch("guardctl.controller.loop.make_client", return_value=slurm):
        text = cli(tmp_path, "control", "--explain", "leaf:s1")
        assert "leaf:s1: open" in text and "for:" in text and "settle:" in text
        assert "node3: quarantined for this component; wait:" in text
        assert "fabric:   fabric leaf:s1 at fault" in cli(tmp_path, "control", "--explain", "node3")
        bad = CliRunner().invoke(
            main, ["control", "--explain", "switch:s1"], env={"GUARDCTL_STORE": str(tmp_path)}
        )
        assert bad.exit_code == 2 and "invalid fabric component" in bad.output
        once = cli(tmp_path, "control", "--once")
        assert "1 fabric finding(s)" in once and "fabric leaf:s1 at fault" in once

    md = cli(tmp_path, "report", "--period", "1h")
    assert "Fabric findings" in md and "leaf:s1" in md
    html = cli(tmp_path, "report", "--period", "1h", "--format", "html")
    assert "Fabric findings" in html and "leaf:s1" in html

    prom = tmp_path / "guardctl.prom"
    cli(tmp_path, "export", "--prometheus", str(prom))
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(prom.read_text())
        for s in fam.samples
    }
    key = (("component", "leaf:s1"), ("kind", "leaf"))
    assert got[("guardctl_fabric_finding", key)] == 1
    assert 0 < got[("guardctl_fabric_finding_confidence", key)] <= 1
    assert got[("guardctl_fabric_finding_nodes", key)] == 4
    assert got[("guardctl_fabric_quarantined_nodes", key)] == 4


def _status(store: Path, slurm: MemorySlurm, *args: str) -> str:
    """``guardctl status`` over the in-memory Slurm (the CLI builds its own client)."""
    with mock.patch("guardctl.nodeops.actions.make_client", return_value=slurm):
        return cli(store, "status", *args)
