"""An ordinary user's job on the Slurm lab hands its steps to the node agents (real ones, root's).

The lab's nodes share this host, so each agent listens at ``<dir>/<node>.sock`` and the job
names that path with ``{node}`` in ``GUARDCTL_AGENT_SOCKET``; on a cluster both use the default.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from labtools import job_python
from storetools import agent_records

from guardctl.nodes import expand
from guardctl.storage import store as store_layout
from guardctl.telemetry.schema import read_path

pytestmark = pytest.mark.slurm

TRAIN = textwrap.dedent("""
    import time
    from guardctl import probe
    for _ in range(4):
        with probe.step():
            time.sleep(0.01)
            probe.comm_begin()
            time.sleep(0.005)
""")


def _agent(store: Path, run: Path, node: str) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        "-m",
        "guardctl",
        "--set",
        'agent.collectors=["host"]',
        "--set",
        f'agent.status_file="{run / node}.json"',
        "--set",
        "agent.status_every=1",
        "--set",
        "agent.interval_s=1",
        "--set",
        "agent.write_interval_s=2",
        "--set",
        f'agent.handoff_socket="{run}/{{node}}.sock"',
        "agent",
        "--store",
        str(store),
        "--node",
        node,
    ]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


def _submit(
    lab: Any, work: Path, store: Path, socket: str, nodes: list[str]
) -> tuple[str, dict[str, str], str]:
    script = (
        "#!/bin/bash\n"
        f"export GUARDCTL_STORE={shlex.quote(str(store))}\n"
        f"export GUARDCTL_AGENT_SOCKET={shlex.quote(socket)}\n"
        f"srun {shlex.quote(job_python())} -c {shlex.quote(TRAIN)}\n"
    )
    args = ("-N2", "--ntasks=2", "--ntasks-per-node=1", "--time=2", "-w", ",".join(nodes))
    job = lab.submit(script, *args, "-o", str(work / "slurm-%j.out"), as_user=work)
    info = lab.wait_job(job, timeout=90)
    output = (work / f"slurm-{job}.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", f"{info}\n{output}"
    return job, info, output


def test_a_users_job_writes_through_the_agents_and_directly_without(lab: Any) -> None:
    work = lab.user_workdir()
    store = work / "store"
    store_layout.init(store)
    run = Path(tempfile.mkdtemp(prefix="agent-run-", dir=lab.dir))
    run.chmod(0o755)  # root's, like /run/guardctl: users connect, nobody else writes in it
    nodes = list(lab.nodes)[:2]  # the job's nodes, an agent for each
    agents: dict[str, subprocess.Popen[str]] = {}
    try:
        for node in nodes:
            agents[node] = _agent(store, run, node)
        deadline = time.monotonic() + 30
        while not all((run / f"{n}.sock").exists() for n in agents):
            assert time.monotonic() < deadline, "the agents did not open their sockets"
            time.sleep(0.2)
        job, info, output = _submit(lab, work, store, f"{run}/{{node}}.sock", nodes)
        time.sleep(3)  # one write_interval_s: the agents append what they took
    finally:
        errors = {}
        for node, proc in agents.items():
            proc.send_signal(signal.SIGTERM)
            errors[node] = proc.communicate(timeout=30)[1]
    assert "guardctl probe" not in output, output  # handed over: nothing to say
    assert not (store / "steps" / job).exists()  # no rank wrote the shared store
    job_nodes = expand(info["NodeList"])
    steps = [r for r in read_path(store / "telemetry").records if r["kind"] == "step"]
    assert len(steps) == 8 and {r["job"] for r in steps} == {job}
    assert sorted({str(r["node"]) for r in steps}) == sorted(job_nodes)
    for node in job_nodes:
        status = json.loads((run / f"{node}.json").read_text())
        assert status["handoff"]["accepted"] == 4, (status, errors[node])
        assert status["handoff"]["refused"] == {}
        mine = agent_records(store, node).records
        assert {r["kind"] for r in mine} == {"host", "agent", "step"}  # one file, every kind
    assert all(not (run / f"{n}.sock").exists() for n in agents)  # each agent removed its own

    # No agent now: the same job writes its own step files, and each rank says so once.
    job, info, output = _submit(lab, work, store, f"{run}/{{node}}.sock", nodes)
    assert output.count("no node agent on this node") == 2, output
    direct = read_path(store / "steps" / job).records
    assert len(direct) == 8 and {r["job"] for r in direct} == {job}
