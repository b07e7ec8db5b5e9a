"""The controller's decisions about fabric findings, by values: a switch at fault takes no node
action, a node fault under a healthy switch is still a node fault, and the optional quarantine
of a finding's nodes (``[control] fabric_quarantine``) waits while it lasts and is released when
it clears. The loop over the in-memory Slurm: test_fabric_control.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_policy import CFG, NOW, entry

from guardctl.actionlog import Entry
from guardctl.analyze.fabric import FabricFinding
from guardctl.controller.classify import Classified, Finding
from guardctl.controller.fabric import fabric_now
from guardctl.controller.ladder import FABRIC, derive
from guardctl.controller.policy import View, decide, fabric_plan
from guardctl.controller.record import faults
from guardctl.sections.control import ControlSettings

LEAF = FabricFinding(
    "leaf:s1",
    "leaf",
    ("n1", "n2", "n3", "n4"),
    ("4 of leaf s1's 4 nodes slow in xmit_wait", "their peers under s2 are not"),
    ("n4's comm time is within its peers'",),
    0.9,
    "a pairwise all-reduce within s1 and one across s1-s2",
)
LINK = FabricFinding(
    "link:n6",
    "link",
    ("n6",),
    ("n6's port errors",),
    ("its leaf peers are healthy",),
    0.8,
    "reseat",
)


def finding(node: str, kind: str, why: str = "w") -> Finding:
    return Finding(node, kind, why, "j1", ("xmit_wait",), 2.0, None, NOW)  # type: ignore[arg-type]


def fabric_view(
    findings: list[Finding],
    fabric: tuple[FabricFinding, ...],
    *,
    entries: list = (),  # type: ignore[assignment,type-arg]
    owners: dict | None = None,  # type: ignore[type-arg]
) -> View:
    return View(
        Classified(tuple(findings), (), fabric), owners or {}, {}, derive(entries), NOW, 10.0
    )


def by_node(v: View, cfg: ControlSettings = CFG) -> dict[str, tuple[str, str]]:
    return {d.node: (d.action, d.why) for d in decide(v, cfg)}


def test_a_switch_at_fault_takes_no_node_action() -> None:
    v = fabric_view([finding(n, "fabric") for n in LEAF.nodes], (LEAF,))
    got = by_node(v)
    assert {a for a, _ in got.values()} == {"none"}, got
    assert all("leaf:s1" in why and "not the node" in why for _, why in got.values())
    # the same nodes as node faults would each be quarantined: the fabric finding is the reason
    as_nodes = by_node(fabric_view([finding(n, "persistent") for n in LEAF.nodes], ()))
    assert {a for a, _ in as_nodes.values()} == {"quarantine"}
    # nor is a switch's node recorded among the nodes at fault (its onsets feed the ladder)
    assert faults(Classified(tuple(finding(n, "fabric") for n in LEAF.nodes))) == []


def test_a_node_fault_under_a_healthy_switch_is_still_a_node_fault() -> None:
    v = fabric_view(
        [*(finding(n, "fabric") for n in LEAF.nodes), finding("n6", "persistent")], (LEAF,)
    )
    got = by_node(v)
    assert got["n6"][0] == "quarantine"
    assert {got[n][0] for n in LEAF.nodes} == {"none"}


def test_a_bad_link_leaves_its_node_on_the_node_ladder() -> None:
    v = fabric_view([finding("n6", "persistent")], (LINK,))
    assert by_node(v)["n6"][0] == "quarantine"
    on = dataclasses.replace(CFG, fabric_quarantine=True)
    assert fabric_plan(v, on) == []  # the node ladder quarantines it, once


def test_fabric_quarantine_is_off_by_default_and_takes_only_nodes_in_service() -> None:
    v = fabric_view(
        [finding(n, "fabric") for n in LEAF.nodes],
        (LEAF,),
        owners={
            "n1": ("held by someone else", "drained by root: cabling"),
            "n2": ("quarantined", "guardctl: control: earlier node fault"),
            "n3": ("in service", ""),
            "n4": ("in service", ""),
        },
    )
    assert fabric_plan(v, CFG) == []
    (plan,) = fabric_plan(v, dataclasses.replace(CFG, fabric_quarantine=True))
    assert plan.finding.component == "leaf:s1" and plan.nodes == ("n3", "n4")
    assert "control.fabric_quarantine" in plan.why


def quarantined_for_leaf(node: str) -> list:  # type: ignore[type-arg]
    return [
        entry(FABRIC, list(LEAF.nodes), NOW - 200, component="leaf:s1", phase="open"),
        entry(
            "quarantine", [node], NOW - 100, "done", by="control", fabric="leaf:s1", kind="fabric"
        ),
    ]


def test_a_node_quarantined_for_a_switch_waits_unswept_then_is_released_when_it_clears() -> None:
    owners = {"n3": ("quarantined", "guardctl: control: fabric leaf:s1")}
    log = quarantined_for_leaf("n3")
    assert derive(log)["n3"].fabric == "leaf:s1"
    lasting = fabric_view([finding("n3", "fabric")], (LEAF,), entries=log, owners=owners)
    action, why = by_node(lasting)["n3"]
    assert action == "wait" and "leaf:s1" in why and "not swept" in why
    cleared = fabric_view([], (), entries=log, owners=owners)
    (d,) = decide(cleared, CFG)
    assert (d.action, d.evidence) == ("release", {"fabric": "leaf:s1"}) and d.acts


def test_a_node_at_fault_on_its_own_when_its_switch_clears_goes_on_with_its_own_ladder() -> None:
    owners = {"n3": ("quarantined", "guardctl: control: fabric leaf:s1")}
    v = fabric_view(
        [finding("n3", "persistent")], (), entries=quarantined_for_leaf("n3"), owners=owners
    )
    assert by_node(v)["n3"][0] == "sweep"  # quarantined and free: swept, not released


def test_a_node_quarantined_for_its_own_fault_is_not_swept_while_its_switch_is_at_fault() -> None:
    owners = {"n3": ("quarantined", "guardctl: control: persistent node fault")}
    log = [entry("quarantine", ["n3"], NOW - 100, "done", by="control")]
    v = fabric_view([finding("n3", "fabric")], (LEAF,), entries=log, owners=owners)
    action, why = by_node(v)["n3"]
    assert action == "wait" and "leaf:s1" in why  # its pairwise sweep would fail for the switch
    assert by_node(fabric_view([], (), entries=log, owners=owners))["n3"][0] == "sweep"


def found(ts: float) -> Entry:
    return Entry(
        f"f{ts}", ts, FABRIC, "note", LEAF.nodes, evidence={**LEAF.as_dict(), "phase": "open"}
    )


def test_the_log_holds_a_finding_open_until_it_clears() -> None:
    log = [
        found(NOW - 300),
        entry(FABRIC, ["n5"], NOW - 250, component="leaf:s2", kind="leaf", phase="open"),
        found(NOW - 200),
        entry(FABRIC, ["n5"], NOW - 100, component="leaf:s2", kind="leaf", phase="cleared"),
        *quarantined_for_leaf("n3")[1:],
    ]
    (now,) = fabric_now(log)
    assert now["component"] == "leaf:s1" and now["since"] == NOW - 300
    assert now["quarantined"] == ["n3"] and now["confidence"] == 0.9 and "phase" not in now


def test_a_checkpoint_of_the_log_keeps_what_is_open() -> None:
    from guardctl.config import Settings
    from guardctl.nodeops.checkpoint import keep

    month = 30 * 86400.0
    log = [
        found(NOW - 2 * month),
        entry(FABRIC, ["n5"], NOW - 2 * month, component="leaf:s2", kind="leaf", phase="open"),
        entry(FABRIC, ["n5"], NOW - month, component="leaf:s2", kind="leaf", phase="cleared"),
        entry(FABRIC, list(LEAF.nodes), NOW - month, component="leaf:s1", phase="quarantine"),
        *(entry("control decision", ["n9"], NOW - month + i) for i in range(5)),
    ]
    kept = keep(log, Settings(), NOW)
    assert len(kept) < len(log)
    assert fabric_now(kept) == fabric_now(log) and fabric_now(kept)[0]["component"] == "leaf:s1"


def test_a_component_a_sweep_named_stays_open_an_hour_though_the_analysis_does_not_name_it(
    tmp_path: Path,
) -> None:
    from guardctl.config import load_settings
    from guardctl.controller.record import SWEEP_FINDING_HOLD_S, record_fabric
    from guardctl.nodeops import NodeOps
    from guardctl.slurm.memory import MemorySlurm

    slurm = MemorySlurm(["n1", "n2", "n3", "n4"], start=NOW)
    ops = NodeOps(load_settings(environ={"GUARDCTL_STORE": str(tmp_path)}), slurm, clock=slurm.time)
    ops.record(
        FABRIC, list(LEAF.nodes), evidence={**LEAF.as_dict(), "phase": "open", "source": "sweep"}
    )
    ops.record(FABRIC, ["n5"], evidence={"component": "leaf:s2", "kind": "leaf", "phase": "open"})
    none = Classified(())
    assert record_fabric(ops, ops.log.entries(), none) == ["leaf:s2"]  # the analysis's: gone
    slurm.advance(SWEEP_FINDING_HOLD_S - 60)
    assert record_fabric(ops, ops.log.entries(), none) == []
    assert [f["component"] for f in fabric_now(ops.log.entries())] == ["leaf:s1"]
    slurm.advance(120)
    assert record_fabric(ops, ops.log.entries(), none) == ["leaf:s1"]
    assert fabric_now(ops.log.entries()) == []
