"""Where the controller cannot be sure, it does not act: a lease file it cannot read or make
sense of is held by someone, and agents whose clocks are far from the controller's hold it back.

Each asserts what Slurm looks like afterwards and what the action log says.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
from controltools import fleet_trace
from sweepchaos import NODES, quarantined, settings

from guardctl.agent.daemon import Agent
from guardctl.controller.loop import Controller
from guardctl.sections.agent import AgentSettings
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SubmitRequest
from guardctl.storage import store


def controller(tmp_path: Path, slurm: MemorySlurm) -> Controller:
    return Controller(settings(tmp_path), act=True, slurm=slurm)


def busy_suspect(tmp_path: Path) -> MemorySlurm:
    """node2 slow under a running job: a pass that acts quarantines it (and waits for the job)."""
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    slurm.submit(SubmitRequest("train.sbatch", nodes=("node2",), job_name="train"))
    slurm.advance(1)
    return slurm


def failing_reads(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Reading the lease file fails as NFS fails it (ESTALE, EIO); other files read as ever."""
    real = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "lease.json":
            raise OSError(code, os.strerror(code))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)


def untouched(c: Controller, slurm: MemorySlurm) -> None:
    assert slurm.reservations() == [] and not any(n.drained for n in slurm.nodes())
    assert not [e for e in c.ops.log.entries() if e.action in ("quarantine", "drain")]


@pytest.mark.parametrize("code", [errno.ESTALE, errno.EIO])
def test_a_lease_file_that_cannot_be_read_is_held(
    tmp_path: Path, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = busy_suspect(tmp_path)
    holder = controller(tmp_path, slurm)
    assert holder.lead()[0]  # another controller leads; this one reads its lease
    c = controller(tmp_path, slurm)
    failing_reads(monkeypatch, code)
    report = c.run_pass()
    assert not report.leader
    assert os.strerror(code) in report.held_back and "taken as held" in report.held_back
    untouched(c, slurm)


def test_the_leader_that_cannot_read_its_lease_stops_acting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = busy_suspect(tmp_path)
    c = controller(tmp_path, slurm)
    assert c.lead()[0]
    failing_reads(monkeypatch, errno.ESTALE)
    assert not c.run_pass().leader  # it cannot renew what it cannot read
    untouched(c, slurm)
    monkeypatch.undo()  # readable again: its own lease, renewed
    report = c.run_pass()
    assert report.leader and quarantined(slurm, "node2")


@pytest.mark.parametrize(
    "text",
    [
        '{"host": "h1", "pid"',
        "[]",
        "\x00\x00\x00",
        '{"host": "h1", "pid": 1, "token": "t", "expires": "soon"}',
    ],
)
def test_a_garbled_lease_file_is_held(tmp_path: Path, text: str) -> None:
    slurm = busy_suspect(tmp_path)
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "lease.json").write_text(text)
    c = controller(tmp_path, slurm)
    report = c.run_pass()
    assert not report.leader and "garbled" in report.held_back
    untouched(c, slurm)
    assert (tmp_path / "control" / "lease.json").read_text() == text  # not written over


def agent_beat(root: Path, node: str, skew_s: float, age_s: float = 0.0) -> None:
    """What an agent whose clock is *skew_s* off writes: its wall clock in its heartbeat, whose
    mtime the file server sets (here: this host's clock, *age_s* ago)."""
    path = root / "clocks" / f"agent.{node}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    at = time.time() - age_s
    path.write_text(json.dumps({"role": "agent", "name": node, "wall": at + skew_s}))
    os.utime(path, (at, at))


@pytest.mark.parametrize("skew_s", [120.0, -120.0])
def test_agents_whose_clocks_are_off_hold_the_controller_back(
    tmp_path: Path, skew_s: float
) -> None:
    slurm = busy_suspect(tmp_path)
    for node in NODES:
        agent_beat(tmp_path, node, 0.5)
    agent_beat(tmp_path, "node5", skew_s)
    lines: list[str] = []
    c = Controller(settings(tmp_path), act=True, slurm=slurm, progress=lines.append)
    report = c.run_pass()
    assert report.leader and not report.acting
    assert "node5" in report.held_back and f"{skew_s:+.0f} s" in report.held_back
    assert [d["outcome"] for d in report.decisions if d["node"] == "node2"] == ["would do"]
    assert [line for line in lines if "max_clock_skew_s" in line]
    untouched(c, slurm)
    agent_beat(tmp_path, "node5", 3.0)  # its clock set right: the next pass acts
    report = c.run_pass()
    assert report.acting and not report.held_back and quarantined(slurm, "node2")


def test_an_agent_long_silent_does_not_hold_the_controller_back(tmp_path: Path) -> None:
    slurm = busy_suspect(tmp_path)
    agent_beat(tmp_path, "node5", 3600.0, age_s=7200.0)  # heard from two hours ago
    c = controller(tmp_path, slurm)
    report = c.run_pass()
    assert report.acting and quarantined(slurm, "node2")


def test_an_agent_beats_its_clock_and_the_controller_reads_it(tmp_path: Path) -> None:
    store.init(tmp_path)  # the site's marked store
    # No status file: the default is the machine's own (/run/guardctl).
    agent = Agent(AgentSettings(collectors=("host",), status_file=""), tmp_path, "node5")
    assert agent.sample()
    beat = tmp_path / "clocks" / "agent.node5.json"
    raw = json.loads(beat.read_text())
    assert raw["name"] == "node5" and abs(raw["wall"] - beat.stat().st_mtime) < 5
    first = beat.stat().st_mtime_ns
    assert agent.sample()  # at most once a minute
    assert beat.stat().st_mtime_ns == first
    agent.close()
    slurm = busy_suspect(tmp_path)
    report = controller(tmp_path, slurm).run_pass()  # this host's agent agrees with it
    assert report.acting and not report.held_back and quarantined(slurm, "node2")
