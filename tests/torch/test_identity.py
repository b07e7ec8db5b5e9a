"""One identity for the probe and the data-sharding client: torchrun first, then Slurm."""

from __future__ import annotations

import pytest

from guardctl import identity
from guardctl.dds import Client
from guardctl.errors import UsageError


def test_torchrun_alone() -> None:
    who = identity.from_env(
        {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "GUARDCTL_JOB": "trial"}
    )
    assert (who.job, who.rank, who.world, who.local_rank, who.launcher) == (
        "trial",
        2,
        4,
        0,
        "torchrun",
    )


def test_slurm_alone() -> None:
    who = identity.from_env(
        {
            "SLURM_JOB_ID": "77",
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURMD_NODENAME": "node3",
        }
    )
    assert who == identity.Identity("77", 5, 8, 1, "node3", "slurm")
    assert who.worker.startswith("node3.r5.")


def test_srun_torchrun_takes_torchruns_ranks() -> None:
    # 2 Slurm tasks (one torchrun per node), 2 processes each: this is task 1's second.
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
    }
    who = identity.from_env(env)
    assert (who.rank, who.world, who.local_rank, who.launcher) == (3, 4, 1, "torchrun")


def test_one_slurm_task_per_rank_must_agree() -> None:
    same = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "RANK": "2", "WORLD_SIZE": "4"}
    assert identity.from_env(same).rank == 2
    with pytest.raises(identity.IdentityError, match="RANK=0 but SLURM_PROCID=2"):
        identity.from_env({**same, "RANK": "0"})  # a RANK exported to every task
    with pytest.raises(identity.IdentityError, match=r"WORLD_SIZE=2 but .*SLURM_NTASKS=4"):
        identity.from_env({**same, "RANK": "0", "WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is not a rank of WORLD_SIZE=4"),
        ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "SLURM_PROCID='x' is not a whole number"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 is negative"),
    ],
)
def test_bad_variables_are_clear_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        identity.from_env(env)


def test_nothing_set_is_rank_0_of_1_without_a_job() -> None:
    who = identity.from_env({})
    assert (who.job, who.rank, who.world, who.launcher) == (None, 0, 1, "none")


def test_the_client_follows_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "GUARDCTL_DDS_JOB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GUARDCTL_JOB", "local-7")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    client = Client(address="127.0.0.1:9", secret="s")  # no request is made
    assert (client.job, client.rank, client.world) == ("local-7", 3, 4)
    assert ".r3." in client.worker
