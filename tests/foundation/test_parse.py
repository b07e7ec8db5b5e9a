"""Parsing Slurm's outputs: recorded 22.05 output from the lab, and the 23.11 shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from guardctl.errors import SlurmError
from guardctl.slurm import parse

FIXTURES = Path(__file__).parent.parent / "fixtures"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_sinfo_22_05_nodes() -> None:
    nodes = {n.name: n for n in parse.nodes_from_json(read("slurm-22.05/sinfo.json"))}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    drained = nodes["node2"]
    assert drained.state == "idle" and drained.drained and drained.flags == {"DRAIN"}
    assert drained.reason == "admin: bad dimm" and drained.reason_user == "root"
    assert drained.reason_time and drained.reason_time > 1.7e9
    assert nodes["node1"].state == "mixed" and not nodes["node1"].drained
    assert nodes["node1"].partitions == ("debug",) and nodes["node1"].cpus == 2
    assert drained.slurm_state == "idle+drain"


def test_squeue_22_05_jobs() -> None:
    jobs = {j.job_id: j for j in parse.jobs_from_json(read("slurm-22.05/squeue.json"))}
    assert jobs[1].state == "RUNNING" and jobs[1].nodes == ("node1",) and jobs[1].user == "root"
    assert jobs[2].state == "PENDING" and not jobs[2].finished
    assert "ReqNodeNotAvail" in jobs[2].reason


def test_reservations_22_05_text() -> None:
    (resv,) = parse.reservations_from_text(read("slurm-22.05/reservations.txt"))
    assert resv.name == "guardctl_q_node3" and resv.nodes == ("node3",)
    assert resv.users == ("root",) and {"MAINT", "IGNORE_JOBS"} <= resv.flags
    assert resv.state == "ACTIVE" and resv.start_time


def test_version() -> None:
    assert parse.version_from_text(read("slurm-22.05/version.txt")) == (22, 5)
    assert parse.version_from_text("slurm 23.11.4") == (23, 11)


def test_scontrol_23_11_nodes() -> None:
    nodes = {n.name: n for n in parse.nodes_from_json(read("slurm-23.11/scontrol_nodes.json"))}
    assert nodes["gpu001"].state == "idle" and nodes["gpu001"].drained
    assert nodes["gpu001"].reason_time == 1796040000
    assert nodes["gpu002"].state == "mixed" and nodes["gpu002"].reason_time is None
    assert nodes["gpu003"].down and "NOT_RESPONDING" in nodes["gpu003"].flags
    assert {"MAINTENANCE", "RESERVED"} <= nodes["gpu004"].flags and not nodes["gpu004"].drained


def test_squeue_23_11_jobs() -> None:
    jobs = {j.job_id: j for j in parse.jobs_from_json(read("slurm-23.11/squeue.json"))}
    assert jobs[812].nodes == ("gpu001", "gpu002") and jobs[812].reservation == "guardctl_q_gpu001"
    assert jobs[812].exit_code == 0 and jobs[812].end_time == 1796043701
    assert jobs[813].state == "FAILED" and jobs[813].finished and jobs[813].exit_code == 3


def test_reservations_23_11_json() -> None:
    (resv,) = parse.reservations_from_json(read("slurm-23.11/scontrol_reservations.json"))
    assert resv.users == ("root", "ops") and resv.end_time is None and "MAINT" in resv.flags


@pytest.mark.parametrize("text", ["", "not json", "[]",
                                  '{"errors": [{"error": "Invalid user"}], "nodes": []}',
                                  '{"meta": {}}'])
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
