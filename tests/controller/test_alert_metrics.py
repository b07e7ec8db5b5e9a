"""What to alert on: the controller's liveness, its actions and refusals, the hooks' failures
and the store, in ``guardctl export --prometheus`` (read by a real parser), and the example
alert rules checked and unit-tested by promtool."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from controltools import fleet_trace
from prometheus_client.parser import text_string_to_metric_families
from test_control_memory import NODES, controller

from guardctl.cli import main
from guardctl.errors import SlurmUnavailable
from guardctl.hooks.run import HOOK_FAILED
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest

RULES = Path(__file__).resolve().parents[2] / "contrib" / "prometheus"


def export(store: Path) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out = store / "textfile" / "guardctl.prom"
    out.parent.mkdir(exist_ok=True)
    res = CliRunner().invoke(
        main,
        ["export", "--prometheus", str(out), "--input", str(store)],
        env={"GUARDCTL_STORE": str(store)},
    )
    assert res.exit_code == 0, res.output
    metrics: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(out.read_text()):
        assert family.documentation, family.name
        for s in family.samples:
            metrics.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return metrics


def test_the_export_says_whether_the_controller_passes_leads_and_acts(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    c = controller(tmp_path, slurm)
    c.acting = False
    before = time.time()
    c.run_pass()  # observe-only: would quarantine, on paper
    m = export(tmp_path)
    (host,) = {dict(k)["host"] for k in m["guardctl_control_last_pass_seconds"]}
    h = (("host", host),)
    assert m["guardctl_control_last_pass_seconds"][h] >= before
    assert 0 < m["guardctl_control_pass_duration_seconds"][h] < 60
    assert m["guardctl_control_leader"][h] == 1 and m["guardctl_control_acting"][h] == 0
    assert m["guardctl_control_observe_only"][h] == 1
    assert m["guardctl_control_pass_failed"][h] == 0
    assert m["guardctl_control_held_back"][(("host", host), ("why", "clock_skew"))] == 0
    assert (
        m["guardctl_control_decisions_total"][(("decision", "quarantine"), ("outcome", "would_do"))]
        == 1
    )
    assert m["guardctl_control_rehearsal_steps_total"][(("step", "quarantine"),)] == 1
    assert "guardctl_node_actions_total" not in m  # nothing done to Slurm
    assert slurm.reservations() == []

    c.acting = True
    c.run_pass()  # acting: quarantined through the door
    c.ops.record(
        HOOK_FAILED,
        ["node4"],
        reason="check gpu_count: 7 of 8 GPUs",
        evidence={"hook": "prolog", "drained": False},
    )
    m = export(tmp_path)
    assert "node2" in slurm.reservations()[0].nodes
    assert m["guardctl_control_acting"][h] == 1 and m["guardctl_control_observe_only"][h] == 0
    assert m["guardctl_node_actions_total"][(("action", "quarantine"), ("outcome", "done"))] == 1
    assert (
        m["guardctl_control_decisions_total"][(("decision", "quarantine"), ("outcome", "done"))]
        == 1
    )
    assert m["guardctl_hook_failures_total"][(("drained", "false"), ("hook", "prolog"))] == 1
    assert m["guardctl_action_intents_open"][()] == 0
    assert m["guardctl_store_writable"][()] == 1 and m["guardctl_action_log_readable"][()] == 1


def test_a_failed_pass_is_said_in_the_export(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm)

    def down() -> list[object]:
        raise SlurmUnavailable("slurmctld: connection refused")

    slurm.nodes = down  # type: ignore[method-assign,assignment]
    with pytest.raises(SlurmUnavailable):
        c.run_pass()
    m = export(tmp_path)
    assert list(m["guardctl_control_pass_failed"].values()) == [1.0], m
    assert list(m["guardctl_control_acting"].values()) == [0.0]
    assert slurm.reservations() == []


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is required in CI (tools/setup.sh installs Prometheus)")
        pytest.skip("promtool not installed (tools/setup.sh installs Prometheus)")
    return found


def test_the_example_alert_rules_are_valid_and_fire_when_they_should() -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", "guardctl-alerts.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", "guardctl-alerts.test.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
