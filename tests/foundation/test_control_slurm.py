"""drain / resume / quarantine / release against the real local Slurm, state read back from it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from guardctl.errors import ExitCode

pytestmark = pytest.mark.slurm


def slurm_node(lab: Any, name: str) -> dict[str, Any]:
    return lab.node_state(name)


def action_log(gctl: Any) -> list[dict[str, Any]]:
    text = (gctl.store / "actions/actions.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def reservations(lab: Any) -> str:
    return lab.sh("scontrol", "show", "-o", "reservation").stdout


def test_drain_resume_round_trip(lab: Any, gctl: Any) -> None:
    proc = gctl("drain", "node2", "--reason", "sweep gemm gpu3 612 TFLOP/s")
    assert proc.returncode == 0, proc.stderr
    raw = slurm_node(lab, "node2")
    assert "DRAIN" in raw["state_flags"]
    assert raw["reason"] == "guardctl: sweep gemm gpu3 612 TFLOP/s"
    assert gctl.status()["node2"]["guardctl"] == "drained by guardctl"

    proc = gctl("resume", "node2")
    assert proc.returncode == 0, proc.stderr
    assert "DRAIN" not in slurm_node(lab, "node2").get("state_flags", [])
    # A node of a lab just (re)started may still be "not responding" for a moment, which
    # guardctl rightly calls held by someone else: give its slurmd that moment.
    deadline = time.monotonic() + 20
    while (shown := gctl.status()["node2"])["guardctl"] != "in service":
        assert time.monotonic() < deadline and "not_responding" in shown["slurm_state"], shown
        time.sleep(0.5)
    log = action_log(gctl)
    assert [(e["action"], e["phase"]) for e in log] == [
        ("drain", "intent"),
        ("drain", "done"),
        ("resume", "intent"),
        ("resume", "done"),
    ]
    assert all(e["actor"] and e["ts"] > 0 for e in log)


def test_quarantine_release_round_trip(lab: Any, gctl: Any) -> None:
    proc = gctl("quarantine", "node[3-4]", "--reason", "straggler in job 42")
    assert proc.returncode == 0, proc.stderr
    text = reservations(lab)
    assert "ReservationName=guardctl_q_node3" in text and "ReservationName=guardctl_q_node4" in text
    assert "MAINT" in text and "IGNORE_JOBS" in text
    status = gctl.status()
    assert status["node3"]["guardctl"] == "quarantined"
    assert status["node3"]["reservation"] == "guardctl_q_node3"
    # Idempotent: quarantining again changes nothing.
    again = gctl.json("quarantine", "node3")
    assert again["actions"][0]["outcome"] == "no change"

    # An ordinary job cannot start on a quarantined node; a job in the reservation can.
    job = lab.sh("sbatch", "--parsable", "-w", "node3", "--wrap", "sleep 1").stdout.strip()
    sweep = lab.sh(
        "sbatch", "--parsable", "-w", "node3", "--reservation=guardctl_q_node3", "--wrap", "true"
    ).stdout.strip()
    deadline = time.time() + 20
    while time.time() < deadline:
        out = lab.sh("squeue", "-h", "-j", f"{job},{sweep}", "-o", "%i %T").stdout
        states = dict(line.split() for line in out.splitlines())
        if states.get(sweep) in (None, "COMPLETED", "COMPLETING"):
            break
        time.sleep(0.5)
    assert states.get(job) == "PENDING"

    proc = gctl("release", "node[3-4]")
    assert proc.returncode == 0, proc.stderr
    assert "guardctl_q_node3" not in reservations(lab)
    assert gctl.status()["node3"]["guardctl"] == "in service"


def test_foreign_drain_left_exactly_as_it_was(lab: Any, gctl: Any) -> None:
    lab.sh("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=admin: bad DIMM")
    before = slurm_node(lab, "node1")
    for args in (
        ("resume", "node1"),
        ("release", "node1"),
        ("drain", "node1", "--reason", "slow"),
        ("quarantine", "node1"),
    ):
        proc = gctl(*args)
        assert proc.returncode == ExitCode.REFUSED, (args, proc.stdout, proc.stderr)
        assert "held by someone else" in proc.stderr and "admin: bad DIMM" in proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("guardctl: error:")
    after = slurm_node(lab, "node1")
    for key in ("state", "state_flags", "reason", "reason_set_by_user", "reason_changed_at"):
        assert after[key] == before[key]
    assert gctl.status()["node1"]["guardctl"] == "held by someone else"
    assert "guardctl_q_node1" not in reservations(lab)


def test_guardctl_prefix_alone_does_not_make_it_ours(lab: Any, gctl: Any) -> None:
    # Someone typed a guardctl-looking reason by hand: guardctl never logged it, so it is not ours.
    lab.sh("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=guardctl: fake")
    assert gctl("resume", "node2").returncode == ExitCode.REFUSED
    assert "DRAIN" in slurm_node(lab, "node2")["state_flags"]


def test_reason_rewritten_by_admin_is_theirs(lab: Any, gctl: Any) -> None:
    assert gctl("drain", "node2", "--reason", "slow").returncode == 0
    lab.sh("scontrol", "update", "NodeName=node2", "Reason=admin: keep out, RMA")
    assert gctl("resume", "node2").returncode == ExitCode.REFUSED
    assert slurm_node(lab, "node2")["reason"] == "admin: keep out, RMA"


def test_foreign_reservation_is_respected(lab: Any, gctl: Any) -> None:
    lab.sh(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=maint_fw",
        "Nodes=node4",
        "Users=root",
        "StartTime=now",
        "Duration=60",
        "Flags=MAINT,IGNORE_JOBS",
    )
    proc = gctl("quarantine", "node4")
    assert proc.returncode == ExitCode.REFUSED and "maint_fw" in proc.stderr
    assert gctl("drain", "node4", "--reason", "x").returncode == ExitCode.REFUSED
    assert "DRAIN" not in slurm_node(lab, "node4").get("state_flags", [])


def test_cap_refuses_whole_action(lab: Any, gctl: Any) -> None:
    # Cap is 2 nodes (config): one held already, two more would make three.
    assert gctl("quarantine", "node1").returncode == 0
    proc = gctl("drain", "node[2-3]", "--reason", "slow")
    assert proc.returncode == ExitCode.REFUSED
    assert "cap" in proc.stderr and "nothing was changed" in proc.stderr
    for name in ("node2", "node3"):
        assert "DRAIN" not in slurm_node(lab, name).get("state_flags", [])
    # Draining the quarantined node itself adds nothing to the count: allowed.
    assert gctl("drain", "node[1-2]", "--reason", "slow").returncode == 0
    assert "guardctl_q_node1" not in reservations(lab)
    status = gctl.status()
    assert status["node1"]["guardctl"] == status["node2"]["guardctl"] == "drained by guardctl"


def test_dry_run_changes_nothing(lab: Any, gctl: Any) -> None:
    out = gctl.json("drain", "node[1-2]", "--reason", "slow", "--dry-run")
    assert out["dry_run"] and {a["outcome"] for a in out["actions"]} == {"would do"}
    assert "DRAIN" not in slurm_node(lab, "node1").get("state_flags", [])
    assert not (gctl.store / "actions/actions.jsonl").exists()


@pytest.mark.parametrize(
    "bad", ["node1;reboot", "node1 node2", "$(id)", "-x", "node[1-", "node1`id`", "@all", "node9"]
)
def test_bad_names_rejected_before_slurm(lab: Any, gctl: Any, tmp_path: Any, bad: str) -> None:
    # Point guardctl at a directory with no Slurm commands: if anything reached Slurm, the error
    # would be "not found" (exit 4). Unknown nodes need Slurm's node list, so they use the real one.
    empty = tmp_path / "nobin"
    empty.mkdir()
    bin_dir = [] if bad == "node9" else ["--set", f"slurm.bin_dir={empty}"]
    proc = gctl(*bin_dir, "drain", bad, "--reason", "x")
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert proc.stderr.startswith("guardctl: error:") and proc.stderr.count("\n") == 1
    assert not (gctl.store / "actions/actions.jsonl").exists()


@pytest.mark.parametrize("timeout_s", [3, 30])
def test_controller_down_is_a_clear_error(lab: Any, gctl: Any, timeout_s: int) -> None:
    # 3 s: guardctl's own timeout fires first. 30 s: sinfo gives up by itself (MessageTimeout)
    # and exits 0 with an "Unspecified error" in its JSON, which guardctl must still recognise.
    lab.stop_controller()
    try:
        started = time.monotonic()
        proc = gctl("--set", f"slurm.timeout_s={timeout_s}", "status", timeout=90)
        elapsed = time.monotonic() - started
    finally:
        lab.start_controller()
    assert proc.returncode == ExitCode.SLURM_UNAVAILABLE, proc.stderr
    assert proc.stderr.startswith("guardctl: error:") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    assert elapsed < timeout_s + 10  # the configured timeout, plus interpreter start-up


def test_crash_between_steps_is_reconciled(lab: Any, gctl: Any) -> None:
    # guardctl dies after Slurm created the reservation, before it logged "done".
    proc = gctl("quarantine", "node2", env={"GUARDCTL_TEST_CRASH": "quarantine:after-slurm"})
    assert proc.returncode == 99
    assert "guardctl_q_node2" in reservations(lab)
    # Reading changes nothing in Slurm: the intent stays open, and status says so.
    shown = gctl("status", "--json")
    assert shown.returncode == 0 and "1 intent(s)" in shown.stderr, shown.stderr
    assert [e["phase"] for e in action_log(gctl)] == ["intent"]
    # The next acting command closes the intent from Slurm's state and owns the node again.
    assert gctl("release", "node2").returncode == 0
    assert "guardctl_q_node2" not in reservations(lab)
    phases = [e["phase"] for e in action_log(gctl)]
    assert phases[:2] == ["intent", "reconciled"]


def test_crash_before_slurm_is_abandoned(lab: Any, gctl: Any) -> None:
    # A drain intent whose scontrol never ran (crash before it): reconciled as abandoned.
    crash = {"GUARDCTL_TEST_CRASH": "drain:before-slurm"}
    proc = gctl("drain", "node3", "--reason", "x", env=crash)
    assert proc.returncode == 99
    assert "DRAIN" not in slurm_node(lab, "node3").get("state_flags", [])
    assert gctl.status()["node3"]["guardctl"] == "in service"
    assert gctl("resume", "node3").returncode == 0  # an acting command: it reconciles first
    phases = [e["phase"] for e in action_log(gctl)]
    assert phases == ["intent", "abandoned"]
