"""examples/real_job on the lab: a user's real job with one node's ranks slow, agents on every
node, the controller as a daemon; the slow node is found and quarantined with nobody in the loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from labtools import JOB_USER, Lab, in_root, job_guardctl, let_job_user_run
from storetools import agent_records

pytestmark = pytest.mark.skipif(
    in_root(),
    reason="the example submits through runuser, which a release's root's chrooting "
    "clients do not allow; it runs on the host's Slurm",
)

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "examples" / "real_job" / "run.sh"


def test_the_slow_node_of_a_users_real_job_is_quarantined_by_the_daemon(lab: Lab) -> None:
    let_job_user_run(sys.executable)  # the ranks run the test's Python as the job user
    top = Path(tempfile.mkdtemp(prefix="real-job-", dir=lab.dir))
    top.chmod(0o755)
    lab.dir.chmod(0o755)
    env = {
        **lab.env,
        "REAL_JOB_DIR": str(top),
        "JOB_USER": JOB_USER,
        "NODES": "4",
        "SLOW_NODE": "node3",
        "WINDOW_S": "8",
        "INTERVAL_S": "2",
        "JOB_SECONDS": "150",
        "TIMEOUT_S": "120",
        "PYTHON": sys.executable,
        "GUARDCTL": job_guardctl(),
    }
    started = time.monotonic()
    run = subprocess.run(
        ["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=200, cwd=top
    )
    took = time.monotonic() - started
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(top.glob("*.log"))
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
    assert "node3 quarantined" in run.stdout, run.stdout

    # Slurm: node3 alone is held by guardctl's quarantine reservation; nothing else changed.
    reservations = lab.sh("scontrol", "show", "reservation").stdout
    assert "guardctl_q_node3" in reservations
    assert reservations.count("ReservationName=") == 1, reservations
    states = lab.states()
    assert all(not s.startswith("drain") for s in states.values()), states

    # The action log: the quarantine of node3, intent then outcome, and no other node action.
    log = _history(top)
    acted = [(e["action"], tuple(e["nodes"]), e["phase"]) for e in log if e["phase"] != "note"]
    assert sorted(acted) == [
        ("quarantine", ("node3",), "done"),
        ("quarantine", ("node3",), "intent"),
    ], log

    # The job was the ordinary user's; its ranks handed their step records to their own node's
    # agent, which wrote them in its node file: no rank wrote the shared store.
    steps = {
        f"node{i}": [
            r for r in agent_records(top / "store", f"node{i}").records if r["kind"] == "step"
        ]
        for i in (1, 2, 3, 4)
    }
    assert all(steps.values()), {node: len(s) for node, s in steps.items()}
    (job,) = {str(r["job"]) for s in steps.values() for r in s}
    assert lab.job_info(job)["UserId"].startswith(f"{JOB_USER}(")
    assert not list((top / "store" / "steps").rglob("*.jsonl"))
    assert took < 180, f"the example took {took:.0f} s"


def _history(top: Path) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("GUARDCTL_STORE", "GUARDCTL_CONFIG")}
    out = subprocess.run(
        [
            job_guardctl(),
            "--config",
            str(top / "guardctl.toml"),
            "history",
            "--json",
            "--limit",
            "1000",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return list(json.loads(out)["entries"])
