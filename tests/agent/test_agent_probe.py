"""The training-job probe: step records, identity from the environment, never blocking."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import Disk

from guardctl import identity, probe
from guardctl.analyze.load import read_frame
from guardctl.storage import layout
from guardctl.storage.writer import BufferedStore, LineWriter
from guardctl.telemetry.schema import read_path


@pytest.fixture(autouse=True)
def _own_probe() -> Iterator[None]:
    # Each test configures the module's probe afresh; flush it so no thread outlives its store.
    yield
    probe.flush()
    probe._default = None


def slurm_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL", "RANK"))}
    env.update(extra)
    return env


def test_the_probe_takes_torchruns_rank_over_slurms(tmp_path: Path) -> None:
    # srun ... torchrun: Slurm's task is the node's torchrun; RANK is the process's rank.
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "SLURMD_NODENAME": "node3",
    }
    p = probe.Probe(identity.from_env(env), tmp_path)
    assert (p.job, p.who.rank, p.who.node) == ("77", 3, "node3")
    local = probe.Probe(identity.from_env({"RANK": "9", "WORLD_SIZE": "10"}), tmp_path)
    assert local.who.rank == 9 and local.job == "local" and local.who.node


def test_steps_are_timed_and_written(tmp_path: Path) -> None:
    p = probe.configure(store=tmp_path, job="42", rank=1, node="node2", flush_interval_s=60)
    for _ in range(3):
        with probe.step():
            time.sleep(0.02)
            probe.comm_begin()
            time.sleep(0.01)
    with probe.step(100):  # no collective: all compute
        time.sleep(0.005)
    assert probe.flush()
    files = sorted((tmp_path / "steps" / "42").iterdir())
    # the rank's file and its column mirror (guardctl.telemetry.mirror)
    assert [f.name.split(".")[:2] for f in files] == [["node2", "r1"]] * 2
    assert [f.suffix for f in files] == [".cols", ".jsonl"]
    assert read_frame(tmp_path).count("step") == 4
    records = read_path(tmp_path).records
    assert [r["step"] for r in records] == [0, 1, 2, 100]
    for r in records[:3]:
        assert (r["job"], r["rank"], r["node"]) == ("42", 1, "node2")
        assert 0.018 < r["compute_s"] < 0.2 and 0.008 < r["comm_s"] < 0.2
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["comm_s"], abs=2e-6)
    assert records[3]["comm_s"] == 0.0 and records[3]["compute_s"] == records[3]["step_s"]
    assert p.stats() == {"queued": 0, "handed_over": 0, "written": 4, "buffered": 0, "dropped": 0}


def test_a_failed_step_is_not_recorded(tmp_path: Path) -> None:
    probe.configure(store=tmp_path, job="1", rank=0, node="n1", flush_interval_s=60)
    with pytest.raises(ZeroDivisionError), probe.step():
        1 / 0  # noqa: B018
    with probe.step():
        pass
    probe.flush()
    assert [r["step"] for r in read_path(tmp_path).records] == [1]


def test_full_queue_drops_and_counts_without_waiting(tmp_path: Path) -> None:
    p = probe.configure(
        store=tmp_path, job="1", rank=0, node="n1", queue_size=5, flush_interval_s=3600
    )
    for _ in range(12):
        with probe.step():
            pass
    assert p.stats()["dropped"] == 7 and p.stats()["queued"] == 5
    probe.flush()
    assert len(read_path(tmp_path).records) == 5


def test_unwritable_store_never_raises_into_training(tmp_path: Path) -> None:
    p = probe.configure(
        store=tmp_path, job="1", rank=0, node="n1", queue_size=4, flush_interval_s=3600
    )
    disk = Disk()
    disk.error = errno.EROFS
    p._store = BufferedStore(4, probe.log, LineWriter(write=disk.write))
    for _ in range(6):
        with probe.step():
            pass
        assert probe.flush() is False  # no exception, just "not written"
    assert p.stats()["buffered"] == 4 and p.stats()["dropped"] == 2
    disk.error = None
    assert probe.flush()
    assert [r["step"] for r in read_path(tmp_path).records] == [2, 3, 4, 5]


def test_background_thread_writes_without_flush(tmp_path: Path) -> None:
    probe.configure(store=tmp_path, job="9", rank=0, node="n1", flush_interval_s=0.05)
    with probe.step():
        pass
    deadline = time.monotonic() + 5
    while not (tmp_path / "steps").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(read_path(tmp_path).records) == 1


def test_written_at_exit_from_the_environment(tmp_path: Path) -> None:
    # A training script that never calls flush(): atexit writes its steps.
    code = textwrap.dedent("""
        from guardctl import probe
        for _ in range(5):
            with probe.step():
                probe.comm_begin()
    """)
    env = slurm_env(
        GUARDCTL_STORE=str(tmp_path),
        SLURM_JOB_ID="5150",
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURMD_NODENAME="node4",
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    path = layout.step_file(tmp_path, "5150", "node4", 3, time.time())
    if not path.exists():  # the hour turned meanwhile
        path = next((tmp_path / "steps" / "5150").iterdir())
    records = read_path(path).records
    assert len(records) == 5 and {(r["job"], r["rank"], r["node"]) for r in records} == {
        ("5150", 3, "node4")
    }


def test_bad_identity_is_refused_at_configure(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="job id"):
        probe.configure(store=tmp_path, job="../etc", rank=0, node="n1")


def test_cuda_events_need_torch() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    p = probe.configure(
        store="/nonexistent-not-written",
        job="1",
        rank=0,
        node="n1",
        cuda_events=True,
        flush_interval_s=3600,
    )
    a = torch.ones((2048, 2048), device="cuda")
    with probe.step():
        a @ a
        probe.comm_begin()
        a @ a
    step_s, compute_s, comm_s = p._durations(*p._queue[0][2:])
    assert step_s > 0 and compute_s > 0 and comm_s >= 0
    p._queue.clear()


def test_a_rank_that_uses_the_probe_loads_neither_the_analyzer_nor_numpy(tmp_path: Path) -> None:
    """Import, step and flush (column mirror included) in a fresh interpreter."""
    code = textwrap.dedent("""
        import sys
        from guardctl import probe
        probe.configure(store=sys.argv[1], job="77", rank=0, node="gn01")
        for _ in range(50):
            with probe.step():
                probe.comm_begin()
        assert probe.flush()
        heavy = sorted(m for m in sys.modules if m == "numpy" or m.startswith("guardctl.analyze"))
        print(",".join(heavy) or "none")
    """)
    repo = str(Path(__file__).resolve().parents[2])  # this checkout's guardctl
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": repo},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "none"
    from guardctl.analyze import mirrors

    (jsonl,) = tmp_path.rglob("*.jsonl")
    assert mirrors.verify(jsonl) == "whole"  # the mirror was kept, without numpy
    assert read_frame(tmp_path).count("step") == 50
