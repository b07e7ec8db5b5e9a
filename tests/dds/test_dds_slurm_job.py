"""The service and its ranks as a real Slurm job on the local lab (examples/dds_job.sbatch).

The job is an ordinary user's, as on a real cluster, in a store that root laid out.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from dds_helpers import REPO
from labtools import JOB_USER, Lab, job_python, job_user_ids

from guardctl.storage import store as store_layout

SBATCH = REPO / "examples" / "dds_job.sbatch"


def test_a_two_node_job_consumes_an_epoch_exactly_once(lab: Lab) -> None:
    work = lab.user_workdir()
    store, logs = work / "store", work / "logs"
    store_layout.init(store)
    logs.mkdir()
    os.chown(logs, *job_user_ids())
    exports = {
        "GUARDCTL_STORE": str(store),
        "PYTHON": job_python(),
        "TRAIN": str(REPO / "examples" / "dds_train.py"),
        "DDS_RECORDS": "20000",
        "DDS_SHARD": "200",
        "DDS_EPOCHS": "2",
        "DDS_LOG_DIR": str(logs),
    }
    export = "ALL," + ",".join(f"{k}={v}" for k, v in exports.items())
    out = work / "slurm-%j.out"
    job = lab.submit(
        SBATCH.read_text(), f"--export={export}", "-o", str(out), "-N", "2", "-n", "4", as_user=work
    )
    info = lab.wait_job(job, timeout=120)
    output = Path(str(out).replace("%j", job)).read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", f"{info}\n{output}"
    assert info["UserId"].startswith(f"{JOB_USER}(")
    service = store / "dds" / job  # the user's own, private to them
    assert service.stat().st_uid == job_user_ids()[0] and service.stat().st_mode & 0o777 == 0o700
    assert sorted(info["NodeList"].replace("node[", "").rstrip("]").split("-")) == ["1", "2"]

    state = store / "dds" / job / "state.sqlite"
    with sqlite3.connect(f"file:{state}?mode=ro", uri=True) as conn:
        done = conn.execute(
            "SELECT epoch, shard, COUNT(*) FROM lease WHERE state = 'done' GROUP BY epoch, shard"
        ).fetchall()
        workers = [w for (w,) in conn.execute("SELECT worker FROM worker")]
    assert len(done) == 100 * 2 and {n for _, _, n in done} == {1}, "not exactly once"
    assert len(workers) == 3  # tasks 1..3 found the service through the store
    assert {w.split(".")[0] for w in workers} == {"node1", "node2"}  # ranks on both nodes
    seen = []
    for log in logs.glob("rank*.jsonl"):
        seen += [(r["epoch"], r["shard"]) for r in map(json.loads, log.read_text().splitlines())]
    assert sorted(seen) == sorted((e, s) for e, s, _ in done)
