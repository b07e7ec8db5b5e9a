"""Parsing Slurm's outputs, captured from the lab on 22.05, 24.11 and 26.05 (every data_parser
version each accepts): tests/capture_fixtures.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardctl.errors import SlurmError
from guardctl.slurm import parse

FIXTURES = Path(__file__).parent.parent / "fixtures"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


# The captured scene (tests/capture_fixtures.py): node1 runs job 1, node2 is drained with job 2
# pending on it, node3 is in a plain reservation, node4 in a maintenance one, node5 is DOWN.
RELEASES = ("22.05", "24.11", "26.05")
NODE_FILES = sorted(
    str(p.relative_to(FIXTURES))
    for p in FIXTURES.glob("slurm-*/*.json")
    if p.name.startswith(("sinfo", "scontrol_nodes"))
)
JOB_FILES = sorted(
    str(p.relative_to(FIXTURES))
    for p in FIXTURES.glob("slurm-*/*.json")
    if p.name.startswith(("squeue", "scontrol_jobs"))
)
RESERVATION_FILES = sorted(
    str(p.relative_to(FIXTURES)) for p in FIXTURES.glob("slurm-*/scontrol_reservations*.json")
)


def test_every_release_was_captured() -> None:
    for release in RELEASES:
        assert f" {release}." in read(f"slurm-{release}/version.txt")
    assert len(NODE_FILES) == len(JOB_FILES) == 1 + 8 + 10  # 22.05, 24.11 and 26.05


@pytest.mark.parametrize("name", NODE_FILES)
def test_captured_nodes(name: str) -> None:
    nodes = {n.name: n for n in parse.nodes_from_json(read(name))}
    assert sorted(nodes) == [f"node{i}" for i in range(1, 7)]
    assert nodes["node1"].state == "mixed" and not nodes["node1"].flags
    drained = nodes["node2"]
    assert drained.state == "idle" and drained.drained and drained.flags == {"DRAIN"}
    assert drained.reason == "admin: bad dimm" and drained.slurm_state == "idle+drain"
    assert drained.reason_time and drained.reason_time > 1.7e9
    down = nodes["node5"]
    assert down.down and down.state == "down" and down.reason == "admin: psu"
    idle = nodes["node6"]
    assert idle.slurm_state == "idle" and not idle.reason and not idle.reason_user
    assert all(n.partitions == ("debug",) and n.cpus == 2 for n in nodes.values())
    if name == "slurm-26.05/sinfo.json":
        # 26.05's default sinfo data_parser (v0.0.45) groups reserved nodes with idle ones and
        # drops the reason's user: why guardctl reads nodes from scontrol.
        assert nodes["node3"].slurm_state == nodes["node4"].slurm_state == "idle"
        assert drained.reason_user == ""
        return
    assert nodes["node3"].slurm_state == "idle+reserved"
    assert nodes["node4"].slurm_state == "idle+maintenance+reserved"
    if name != "slurm-26.05/sinfo.v0.0.45.json":  # v0.0.45's sinfo has no reason user
        assert drained.reason_user == "root"


@pytest.mark.parametrize("name", JOB_FILES)
def test_captured_jobs(name: str) -> None:
    jobs = {j.job_id: j for j in parse.jobs_from_json(read(name))}
    running, pending = jobs[1], jobs[2]
    assert running.state == "RUNNING" and running.nodes == ("node1",) and running.user == "root"
    assert running.name == "running" and running.partition == "debug" and not running.finished
    assert running.start_time and running.submit_time and running.exit_code == 0
    assert pending.state == "PENDING" and pending.nodes == () and not pending.finished
    assert pending.reason == "ReqNodeNotAvail" and pending.start_time is None


@pytest.mark.parametrize("name", RESERVATION_FILES)
def test_captured_reservations_json(name: str) -> None:
    resv = {r.name: r for r in parse.reservations_from_json(read(name))}
    assert resv["plain"].nodes == ("node3",) and "MAINT" not in resv["plain"].flags
    maint = resv["guardctl_q_node4"]
    assert maint.nodes == ("node4",) and maint.users == ("root",)
    assert {"MAINT", "IGNORE_JOBS"} <= maint.flags and maint.start_time


@pytest.mark.parametrize("release", RELEASES)
def test_captured_reservations_text(release: str) -> None:
    text = read(f"slurm-{release}/reservations.txt")
    resv = {r.name: r for r in parse.reservations_from_text(text)}
    maint = resv["guardctl_q_node4"]
    assert maint.nodes == ("node4",) and maint.state == "ACTIVE"
    assert {"MAINT", "IGNORE_JOBS"} <= maint.flags
    assert resv["plain"].users == ("root",)


def test_version() -> None:
    for release in RELEASES:
        major, minor = (int(x) for x in release.split("."))
        assert parse.version_from_text(read(f"slurm-{release}/version.txt")) == (major, minor)


def test_scontrol_numbers_unset_and_infinite() -> None:
    assert parse.number({"set": True, "infinite": False, "number": 7}) == 7
    assert parse.number({"set": False, "infinite": False, "number": 0}) is None
    assert parse.number({"set": True, "infinite": True, "number": 0}) is None


def test_new_state_flags_are_kept_as_flags() -> None:
    # Flags of 23.02-26.05 that guardctl has no word for are shown as they are.
    base, flags = parse.split_state(["IDLE", "PLANNED", "REBOOT_REQUESTED", "BLOCKED"])
    assert base == "idle" and flags == {"PLANNED", "REBOOT_REQUESTED", "BLOCKED"}
    assert parse.split_state(["FUTURE_STATE_X"]) == ("unknown", frozenset({"FUTURE_STATE_X"}))


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '{"errors": [{"error": "Invalid user"}], "nodes": []}', '{"meta": {}}'],
)
def test_bad_json_is_a_slurm_error(text: str) -> None:
    with pytest.raises(SlurmError):
        parse.nodes_from_json(text)


def test_key_values_keep_embedded_equals() -> None:
    kv = parse.parse_key_values("ReservationName=r TRES=cpu=2,mem=4G Users=root Flags=MAINT")
    assert kv == {"ReservationName": "r", "TRES": "cpu=2,mem=4G", "Users": "root", "Flags": "MAINT"}


def test_state_variants() -> None:
    assert parse.split_state("idle*", ["DRAIN"]) == ("idle", frozenset({"DRAIN"}))
    assert parse.split_state(["DOWN", "DRAIN"]) == ("down", frozenset({"DRAIN"}))
    assert parse.split_state("mixed+maint") == ("mixed", frozenset({"MAINT"}))


# The BLOCKED scene (tests/capture_fixtures.py, 24.11+): node1 runs an --exclusive=topo job in a
# topology block of node1-node4, which leaves node2-node4 BLOCKED.
BLOCKED_NODE_FILES = sorted(
    str(p.relative_to(FIXTURES))
    for p in FIXTURES.glob("slurm-*/blocked/*.json")
    if p.name.startswith(("sinfo", "scontrol_nodes"))
)


def test_blocked_was_captured_on_every_release_that_has_it() -> None:
    assert {name.split("/")[0] for name in BLOCKED_NODE_FILES} == {"slurm-24.11", "slurm-26.05"}


@pytest.mark.parametrize("name", BLOCKED_NODE_FILES)
def test_blocked_nodes_in_json(name: str) -> None:
    nodes = {n.name: n for n in parse.nodes_from_json(read(name))}
    assert nodes["node1"].state == "mixed"
    blocked = {n: nodes[n].slurm_state for n in ("node2", "node3", "node4")}
    # Only data_parser v0.0.44+ (26.05's default) carries the flag; every older one says "idle",
    # which is why guardctl pins the newest data_parser and reads 24.11's flags from text.
    old = name.endswith((".v0.0.42.json", ".v0.0.43.json"))
    shows = name.startswith("slurm-26.05/") and not old
    assert set(blocked.values()) == ({"idle+blocked"} if shows else {"idle"}), blocked


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_blocked_flags_from_text_join_the_json(release: str) -> None:
    # v0.0.42, the one both share: neither shows BLOCKED in it.
    nodes = parse.nodes_from_json(read(f"slurm-{release}/blocked/scontrol_nodes.v0.0.42.json"))
    assert not any(n.flags for n in nodes)
    merged = {
        n.name: n
        for n in parse.with_flags_from_text(nodes, read(f"slurm-{release}/blocked/nodes.txt"))
    }
    assert merged["node1"].slurm_state == "mixed"
    assert {merged[n].slurm_state for n in ("node2", "node3", "node4")} == {"idle+blocked"}


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_text_flags_add_nothing_where_the_json_has_them(release: str) -> None:
    # The main scene: drained, reserved, maintenance and down nodes read the same either way
    # (the text names the flags as the JSON does, so nothing unknown is added).
    nodes = parse.nodes_from_json(read(f"slurm-{release}/scontrol_nodes.json"))
    assert parse.with_flags_from_text(nodes, read(f"slurm-{release}/nodes.txt")) == nodes
