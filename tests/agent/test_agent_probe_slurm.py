"""The probe inside a real sbatch job on the local Slurm lab: job, rank and node are right.

The job is an ordinary user's, as every job on a real cluster is, writing into a store that root
laid out with ``guardctl store init``.
"""

from __future__ import annotations

import shlex
import textwrap
from typing import Any

import pytest
from labtools import JOB_USER, job_python, job_user_ids

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


def test_probe_in_a_two_node_job(lab: Any) -> None:
    work = lab.user_workdir()
    store = work / "store"
    store_layout.init(store)  # root's, as an administrator makes it
    script = (
        "#!/bin/bash\n"
        f"export GUARDCTL_STORE={shlex.quote(str(store))}\n"
        "export GUARDCTL_AGENT_SOCKET=\n"  # no node agent here: the ranks write the store
        f"srun {shlex.quote(job_python())} -c {shlex.quote(TRAIN)}\n"
    )
    job = lab.submit(
        script,
        "-N2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--time=2",
        "-o",
        str(work / "slurm-%j.out"),
        as_user=work,
    )
    info = lab.wait_job(job, timeout=90)
    output = (work / f"slurm-{job}.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", f"{info}\n{output}"
    uid = job_user_ids()[0]
    assert info["UserId"].startswith(f"{JOB_USER}(")
    job_dir = store / "steps" / job
    assert job_dir.stat().st_uid == uid and {p.stat().st_uid for p in job_dir.iterdir()} == {uid}
    assert "guardctl probe" not in output  # nothing to say: every step was written
    nodes = expand(info["NodeList"])
    result = read_path(store)
    assert result.bad_total == 0
    by_rank = {r["rank"]: r for r in result.records}
    assert sorted(by_rank) == [0, 1]
    assert all(r["job"] == job for r in result.records)
    assert sorted(r["node"] for r in by_rank.values()) == sorted(nodes)
    assert len(result.records) == 8
    for path in (store / "steps" / job).glob("*.jsonl"):  # (beside each, its .cols mirror)
        node, rank = path.name.split(".")[:2]
        assert {(r["node"], f"r{r['rank']}") for r in read_path(path).records} == {(node, rank)}
