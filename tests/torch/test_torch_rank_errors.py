"""A rank kept waiting says why, and guardctl's own errors end it with one line, not a traceback.

The ranks are real processes running the adapters, against a real service or none.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dds_helpers import REPO, ServiceProcess  # noqa: E402

from guardctl.config import load_settings  # noqa: E402
from guardctl.torch import StepSampler  # noqa: E402

# One rank of a per-step job, as a training script writes it.
RANK = textwrap.dedent("""
    from torch.utils.data import DataLoader, TensorDataset
    import torch
    from guardctl.torch import StepSampler

    sampler = StepSampler(client_options={"rank": 0, "world": 1})
    for (batch,) in DataLoader(TensorDataset(torch.arange(64)), batch_sampler=sampler):
        sampler.take()
    print("trained")
""")

# One rank of a pull-mode job whose shards are leased in DataLoader worker processes.
PULL_RANK = textwrap.dedent("""
    from torch.utils.data import DataLoader, TensorDataset
    import torch
    from guardctl.torch import ShardDataset

    shards = ShardDataset(TensorDataset(torch.arange(64)), 8)
    for batch in shards.trained(DataLoader(shards, batch_size=None, num_workers=2)):
        pass
    print("trained")
""")


def run_rank(
    store: Path, job: str, config: str = "", script: str = RANK
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    # No node agent here, by setting: the rank's stderr holds only what these tests judge.
    env.update(GUARDCTL_STORE=str(store), GUARDCTL_JOB=job, GUARDCTL_AGENT_SOCKET="")
    if config:
        (store / "guardctl.toml").write_text(config)
        env["GUARDCTL_CONFIG"] = str(store / "guardctl.toml")
    return subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_rank_without_a_service_says_what_it_waits_for_then_ends_in_one_line(
    tmp_path: Path,
) -> None:
    rank = run_rank(tmp_path, "9301", "[dds]\ndiscover_timeout_s = 6.5\n")
    lines = rank.stderr.strip().splitlines()
    assert rank.returncode == 8, rank.stderr
    assert "Traceback" not in rank.stderr and "trained" not in rank.stdout
    waiting, reason = lines  # one notice after 5 s (the next would be at 35 s), one reason
    assert waiting.startswith("guardctl: job 9301 has no data-sharding service yet: waiting for")
    assert "guardctl dds serve --job 9301" in waiting and str(tmp_path / "dds" / "9301") in waiting
    assert reason.startswith("guardctl: no data-sharding service published for job 9301")
    assert "within 6 s (dds.discover_timeout_s)" in reason


def test_a_pull_rank_whose_workers_find_no_service_ends_in_one_line(tmp_path: Path) -> None:
    rank = run_rank(tmp_path, "9304", "[dds]\ndiscover_timeout_s = 1\n", PULL_RANK)
    assert rank.returncode == 8 and "Traceback" not in rank.stderr, rank.stderr
    assert rank.stderr.strip().splitlines() == [
        f"guardctl: no data-sharding service published for job 9304 in {tmp_path}/dds/9304 "
        "within 1 s (dds.discover_timeout_s): is `guardctl dds serve` running for this job?"
    ]


def test_a_request_the_service_refuses_ends_the_rank_in_one_line(
    service: Callable[..., ServiceProcess],
) -> None:
    svc = service("9302", "--records", "64", "--shard-size", "16")  # pull mode: no global batch
    rank = run_rank(svc.store, "9302")
    assert rank.returncode == 2 and "Traceback" not in rank.stderr
    assert rank.stderr.strip().splitlines() == [
        "guardctl: /v1/step: this job hands out whole shards (pull mode): per-step requests "
        "need a service started with --global-batch"
    ]


def test_a_programming_error_keeps_its_traceback(service: Callable[..., ServiceProcess]) -> None:
    svc = service("9303", "--records", "64", "--shard-size", "16", "--global-batch", "16")
    settings = load_settings(assignments=(f"store.root={svc.store}",), environ={})
    sampler = StepSampler(
        client_options={"job": svc.job, "settings": settings, "rank": 0, "world": 1},
        compute_s=lambda: 1 / 0,
    )
    with pytest.raises(ZeroDivisionError):
        next(iter(sampler))
