"""The PyTorch DDP example as a real Slurm job on the local lab: 2 nodes x 2 tasks, rank 3 slow.

The job is an ordinary user's, as on a real cluster, in a store that root laid out.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from labtools import JOB_USER, Lab, in_root, job_user_ids

from guardctl.storage import store as store_layout

pytestmark = pytest.mark.skipif(
    in_root(), reason="torch is installed for the host's Python only, not in the lab's roots"
)

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "torch_ddp_job.sbatch"
RECORDS = 4096


def test_the_ddp_example_rebalances_and_the_slow_node_is_found(lab: Lab) -> None:
    work = lab.user_workdir()
    store, logs = work / "store", work / "logs"
    store_layout.init(store)
    exports = {
        "GUARDCTL_STORE": str(store),
        "PYTHON": sys.executable,
        "TRAIN": str(REPO / "examples" / "torch_ddp_train.py"),
        "DDS_RECORDS": str(RECORDS),
        "DDS_EPOCHS": "1",
        "DDS_GLOBAL_BATCH": "64",
        "TRAIN_ARGS": f"--slow-rank 3 --slow 8 --sample-ms 2 --out {logs}",
    }
    export = "ALL," + ",".join(f"{k}={v}" for k, v in exports.items())
    out = work / "slurm-%j.out"
    job = lab.submit(
        SBATCH.read_text(),
        f"--export={export}",
        "-o",
        str(out),
        "-N",
        "2",
        "--ntasks-per-node",
        "2",
        as_user=work,
    )
    info = lab.wait_job(job, timeout=480)
    output = Path(str(out).replace("%j", job)).read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", f"{info}\n{output}"
    assert info["UserId"].startswith(f"{JOB_USER}(")
    uid = job_user_ids()[0]
    assert {p.stat().st_uid for p in (store / "steps" / job).iterdir()} == {uid}

    ranks = {}
    trained: list[int] = []
    shares: dict[int, list[float]] = {}
    for r in range(4):
        records = [json.loads(line) for line in (logs / f"rank{r}.jsonl").read_text().splitlines()]
        ranks[r] = records[-1]
        for rec in records[:-1]:
            trained += rec["indices"]
            shares.setdefault(rec["step"], [0.0] * 4)[r] = rec["share"] / rec["batch"]
    # The model learnt, every rank ended with the same weights.
    assert {round(v["loss_after"], 6) for v in ranks.values()} == {round(ranks[0]["loss_after"], 6)}
    assert ranks[0]["loss_after"] < 0.2 * ranks[0]["loss_before"], ranks[0]
    # Every sample of the epoch trained on exactly once.
    assert sorted(trained) == list(range(RECORDS))
    # The slow rank's share of the later steps fell below 10%.
    later = [shares[s][3] for s in sorted(shares)][len(shares) // 2 :]
    assert statistics.median(later) < 0.10, later
    # The ranks live on two nodes; analyze with default settings finds the slow rank's one.
    assert {v["node"] for v in ranks.values()} == {"node1", "node2"}
    slow, fast = ranks[3]["node"], ranks[0]["node"]
    # Default settings: the slow rank is flagged, per sample; a job this short (seconds) fits
    # in one 300 s window, so persistence (2 of 3 windows) cannot make it a suspect yet.
    default = analyze_json(store)
    reasons = {n["node"]: " ".join(n["reasons"]) for n in default["nodes"]}
    assert "busy_time: rank 3 compute_s_per_sample" in reasons[slow], reasons
    # Windows that the job's length spans (a quarter of it each): the slow rank's node is a
    # suspect, the other is not.
    steps = step_summary(store)
    quarter = (max(s[2] for s in steps) - min(s[1] for s in steps)) / 4
    short = analyze_json(store, f"analyze.window_s={quarter:.2f}")
    verdicts = {n["node"]: n["verdict"] for n in short["nodes"]}
    assert verdicts == {slow: "suspect", fast: "healthy"}, (short, steps)


def analyze_json(store: Path, *settings: str) -> dict:
    env = {**os.environ, "GUARDCTL_STORE": str(store)}
    argv = [sys.executable, "-m", "guardctl"]
    for setting in settings:
        argv += ["--set", setting]
    argv += ["analyze", "--input", str(store / "steps"), "--json"]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode in (0, 1), run.stderr
    return dict(json.loads(run.stdout))


def step_summary(store: Path) -> list[tuple[str, float, float, list[int]]]:
    """Per rank file: first and last step time and some shares (for a failure's message)."""
    out = []
    for path in sorted((store / "steps").rglob("*.jsonl")):
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        out.append((path.name, recs[0]["ts"], recs[-1]["ts"], [r["samples"] for r in recs[::8]]))
    return out
