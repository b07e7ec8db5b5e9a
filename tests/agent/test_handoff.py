"""Ranks hand their step records to the node agent over its socket; the agent is the one writer.

Real sockets, a real agent (host and InfiniBand collectors over a recorded tree) and real probes;
an ordinary user's rank is a forked child that became ``nobody``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import settings
from storetools import agent_files, agent_records

from guardctl import identity, probe
from guardctl.agent import handoff
from guardctl.agent.daemon import Agent
from guardctl.agent.handoff import AgentLink, Inbox, slurm_job_of, store_id
from guardctl.storage import layout, store
from guardctl.telemetry.schema import dumps, make_record, read_path

NOBODY = 65534
log = logging.getLogger("test.handoff")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A marked store and a socket directory every user can reach (tmp_path is root's own)."""
    top = Path(tempfile.mkdtemp(prefix="guardctl-handoff-", dir="/tmp"))
    top.chmod(0o755)
    store.init(top / "store")
    (top / "run").mkdir(mode=0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def agent_of(top: Path, node: str = "node1", **changes: object) -> Agent:
    options = {"collectors": ("host", "infiniband"), "write_interval_s": 10.0, **changes}
    agent = Agent(
        settings(handoff_socket=str(top / "run" / "agent.sock"), **options),  # type: ignore[arg-type]
        top / "store",
        node,
    )
    agent.open_inbox()
    assert agent.inbox is not None, agent.status()
    return agent


def rank_of(top: Path, job: str = "77", node: str = "node1", **kw: object) -> probe.Probe:
    who = identity.Identity(job, 0, 1, 0, node)
    path = str(top / "run" / "agent.sock")
    return probe.Probe(who, top / "store", flush_interval_s=3600, agent_socket=path, **kw)  # type: ignore[arg-type]


def steps(rank: probe.Probe, count: int) -> None:
    for _ in range(count):
        with rank.step():
            rank.comm_begin()


def node_records(top: Path, node: str = "node1") -> list[dict[str, object]]:
    result = agent_records(top / "store", node)
    assert result.bad_total == 0
    return result.records


def step_files(top: Path) -> list[Path]:
    return sorted((top / "store" / "steps").rglob("*"))


def test_steps_reach_the_agents_node_file_and_no_rank_file(shared: Path) -> None:
    agent = agent_of(shared)
    rank = rank_of(shared)
    steps(rank, 5)
    assert rank.flush() and rank.stats()["handed_over"] == 5
    assert agent.tick(at=0.0)  # the first sample writes at once, with the 5 steps
    steps(rank, 3)
    assert rank.flush()
    assert not agent.tick(at=5.0)  # within write_interval_s: kept for the next write
    assert [r["kind"] for r in node_records(shared)].count("step") == 5
    assert agent.tick(at=10.0)
    agent.close()
    records = node_records(shared)
    kinds = {str(r["kind"]) for r in records}
    assert kinds == {"host", "nic", "agent", "step"}  # one file holds every kind
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(8))
    assert step_files(shared) == []  # no rank wrote the shared store
    assert len(agent_files(shared / "store", "node1")) == 1
    assert agent.status()["handoff"]["accepted"] == 8


def test_an_agent_restart_loses_nothing_within_the_buffer(
    shared: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    agent = agent_of(shared)
    rank = rank_of(shared)
    steps(rank, 4)
    assert rank.flush()
    agent.close()  # SIGTERM: what it holds is written, the socket goes
    sock = shared / "run" / "agent.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # as a killed agent leaves it: there, but nobody listens
    stale.close()
    steps(rank, 6)
    assert not rank.flush() and not rank.flush()  # kept, not written anywhere
    assert rank.stats()["buffered"] == 6 and rank.stats()["dropped"] == 0
    assert capfd.readouterr().err.count("does not answer") == 1  # said once
    again = agent_of(shared)
    assert rank.flush() and rank.stats()["buffered"] == 0
    assert "takes step records again" in capfd.readouterr().err
    again.close()
    records = [r for r in node_records(shared) if r["kind"] == "step"]
    assert sorted(int(str(r["step"])) for r in records) == list(range(10))
    assert step_files(shared) == []


def test_at_exit_what_the_agent_did_not_take_is_written_directly(
    shared: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(shared / "run" / "agent.sock"))  # an agent that is not answering
    stale.close()
    rank = rank_of(shared)
    steps(rank, 3)
    assert not rank.flush()
    assert rank.flush(final=True)  # the exit's flush: there is no later
    assert "did not take the last 3 steps before exit" in capfd.readouterr().err
    assert len(read_path(shared / "store" / "steps" / "77").records) == 3


def test_a_full_buffer_drops_the_oldest_counted_and_the_agent_reports_it(shared: Path) -> None:
    sock = shared / "run" / "agent.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    rank = rank_of(shared, queue_size=4)
    for _ in range(3):
        steps(rank, 3)
        assert not rank.flush()
    assert rank.stats()["dropped"] == 5 and rank.stats()["buffered"] == 4
    agent = agent_of(shared)
    assert rank.flush()
    agent.close()
    kept = [r["step"] for r in node_records(shared) if r["kind"] == "step"]
    assert kept == [5, 6, 7, 8]  # the newest
    assert agent.status()["handoff"]["probe_dropped"] == {"77": 5}


def test_a_rank_of_another_store_writes_its_own(shared: Path, tmp_path: Path) -> None:
    agent = agent_of(shared)
    other = tmp_path / "other"
    store.init(other)
    who = identity.Identity("77", 0, 1, 0, "node1")
    rank = probe.Probe(
        who, other, flush_interval_s=3600, agent_socket=str(shared / "run" / "agent.sock")
    )
    steps(rank, 2)
    assert rank.flush()
    agent.close()
    assert len(read_path(other / "steps" / "77").records) == 2
    assert agent.status()["handoff"]["refused"] == {"another store": 2}


def test_a_rank_another_nodes_agent_refuses_writes_its_own_and_loses_nothing(
    shared: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Several agents on one host with one socket path: a rank reaches another node's agent.
    agent = agent_of(shared, node="node4")
    rank = rank_of(shared, node="node3")
    steps(rank, 3)
    assert rank.flush()
    steps(rank, 2)
    assert rank.flush()
    agent.close()
    assert agent.status()["handoff"]["refused"] == {"another node": 3}
    assert [r["step"] for r in read_path(shared / "store" / "steps" / "77").records] == [
        0,
        1,
        2,
        3,
        4,
    ]
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and "refused all 3 step records" in err[0], err


def test_without_an_agent_the_rank_writes_directly_and_says_so_once(
    shared: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    rank = rank_of(shared)
    for _ in range(3):
        steps(rank, 2)
        assert rank.flush()
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and "no node agent on this node" in err[0], err
    assert len(read_path(shared / "store" / "steps" / "77").records) == 6


def _send_as_nobody(sock: Path, lines: list[str], out: Path) -> int:
    """Fork; the child becomes nobody, sends one batch and writes the agent's answer to *out*."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(str(sock))
                s.sendall("".join(f"{line}\n" for line in lines).encode())
                out.write_text(s.recv(100).decode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _step(job: str, node: str = "node1", step: int = 0, ago: float = 0.0) -> str:
    ts = time.time() - ago
    record = make_record("step", node, ts, job=job, rank=0, step=step, step_s=0.1)
    return dumps(record)


@as_root
def test_a_user_cannot_write_another_jobs_or_nodes_records(shared: Path) -> None:
    sock = shared / "run" / "agent.sock"
    # The kernel says who sent; /proc says which Slurm job that process runs in: here 77.
    inbox = Inbox(str(sock), "node1", shared / "store", log, job_of=lambda pid: "77")
    assert inbox.open()
    out = shared / "answer"
    out.touch()
    out.chmod(0o666)
    try:
        batch = [
            _step("77", step=1),  # its own job: taken
            _step("78", step=2),  # someone else's Slurm job
            _step("77", node="node2", step=3),  # another node's
            dumps(make_record("host", "node1", time.time(), cpu_util=0.5)),  # not a step
            '{"v":1,"kind":"step"',  # not a record
            _step("my-run", step=4),  # a name of its own (GUARDCTL_JOB): the first user's
            _step("77", step=5, ago=7200),  # two hours off: would open another hour's file
            f"end 0 {store_id(shared / 'store')}",
        ]
        assert _send_as_nobody(sock, batch, out) == 0
        assert out.read_text() == "ok 2 5\n"
        rec = inbox.take()
        assert [json.loads(raw)["step"] for _, raw in rec] == [1, 4]
        # root (another uid than nobody's) already named "my-run": nobody may not use it now.
        inbox._claims["their-run"] = 0
        assert _send_as_nobody(sock, [_step("their-run"), "end 0 -"], out) == 0
        assert out.read_text() == "store\n"  # and a store it does not name is refused first
        sid = store_id(shared / "store")
        assert _send_as_nobody(sock, [_step("their-run"), f"end 0 {sid}"], out) == 0
        assert out.read_text() == "ok 0 1\n"
    finally:
        inbox.close()
    assert inbox.stats.refused == {
        "another job": 2,
        "another node": 1,
        "not a step record": 1,
        "not a record": 1,
        "another store": 1,
        "time far from now": 1,
    }


def test_a_hostile_client_is_dropped_counted_and_others_go_on(shared: Path) -> None:
    sock = shared / "run" / "agent.sock"
    inbox = Inbox(str(sock), "node1", shared / "store", log)
    assert inbox.open()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bad:
            bad.connect(str(sock))
            bad.sendall(b"x" * (handoff.MAX_LINE + 10))  # no newline, ever
            bad.settimeout(5)
            assert bad.recv(10) == b""  # the agent hung up
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bad:
            bad.connect(str(sock))
            bad.sendall(b"end lots\n")
            bad.settimeout(5)
            assert bad.recv(10) == b""
        link = AgentLink(str(sock))
        assert link.send([_step("77")], 0, store_id(shared / "store")) == 1
        link.close()
    finally:
        inbox.close()
    assert inbox.stats.dropped_clients == {"line too long": 1, "bad end of batch": 1}
    assert len(inbox.take()) == 1


def test_the_socket_is_never_made_through_a_symlink_or_in_a_shared_directory(
    shared: Path,
) -> None:
    elsewhere = shared / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (shared / "link").symlink_to(elsewhere)
    inbox = Inbox(str(shared / "link" / "agent.sock"), "node1", shared / "store", log)
    assert not inbox.open() and "not a directory" in inbox.stats.error
    assert list(elsewhere.iterdir()) == []
    victim = shared / "victim"
    victim.write_text("keep me\n")
    (shared / "run" / "agent.sock").symlink_to(victim)
    inbox = Inbox(str(shared / "run" / "agent.sock"), "node1", shared / "store", log)
    assert not inbox.open() and "not a socket" in inbox.stats.error
    assert victim.read_text() == "keep me\n"
    # A rank does not take a symlink for the agent either: it writes the store itself.
    assert not AgentLink(str(shared / "run" / "agent.sock")).present()
    open_dir = shared / "tmp"
    open_dir.mkdir()
    open_dir.chmod(0o1777)
    inbox = Inbox(str(open_dir / "agent.sock"), "node1", shared / "store", log)
    assert not inbox.open() and "writable by nobody else" in inbox.stats.error


def test_a_second_agent_does_not_take_over_a_live_socket(shared: Path) -> None:
    first = agent_of(shared)
    second = Inbox(str(shared / "run" / "agent.sock"), "node1", shared / "store", log)
    assert not second.open() and "another agent listens there" in second.stats.error
    first.close()
    assert not (shared / "run" / "agent.sock").exists()


def test_the_slurm_job_of_a_process_comes_from_what_root_set(tmp_path: Path) -> None:
    proc = tmp_path / "proc"

    def process(pid: int, ppid: int, comm: str, uid: int, cmdline: bytes, cgroup: str = "") -> None:
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0\n")
        (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "cmdline").write_bytes(cmdline)
        (d / "cgroup").write_text(cgroup or "0::/user.slice\n")

    process(1, 0, "init", 0, b"init\x00")
    process(50, 1, "slurmstepd", 0, b"slurmstepd: [1234.0]\x00")
    process(60, 50, "bash", 1000, b"bash\x00")
    process(70, 60, "python3", 1000, b"python3\x00train.py\x00")
    process(80, 1, "slurmstepd", 1000, b"slurmstepd: [999.0]\x00")  # a user's own imitation
    process(90, 80, "python3", 1000, b"python3\x00")
    process(
        95, 1, "python3", 1000, b"python3\x00", "0::/system.slice/slurmstepd.scope/job_55/step_0\n"
    )
    assert slurm_job_of(70, str(proc)) == "1234"
    assert slurm_job_of(90, str(proc)) is None
    assert slurm_job_of(95, str(proc)) == "55"
    assert slurm_job_of(12345, str(proc)) is None  # gone


def test_the_agent_writes_at_its_cadence_with_one_append_each(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = agent_of(shared, column_files=False)
    appends: list[Path] = []
    real = agent.store.writer.append

    def counted(path: Path, data: bytes) -> None:
        appends.append(path)
        real(path, data)

    monkeypatch.setattr(agent.store.writer, "append", counted)
    ranks = [rank_of(shared) for _ in range(8)]
    for at in range(0, 60, 5):  # a minute of samples 5 s apart
        for rank in ranks:
            steps(rank, 20)
            assert rank.flush()
        agent.tick(at=float(at))
    agent.close()
    assert len(appends) == 6 + 1  # every 10 s, and at the end
    assert len([r for r in node_records(shared) if r["kind"] == "step"]) == 8 * 20 * 12
    assert layout.steps_dir(shared / "store").is_dir() and step_files(shared) == []


def test_the_epilogs_straggler_summary_finds_steps_in_the_agents_node_files(shared: Path) -> None:
    from guardctl.hooks.run import straggler_summary

    for node, compute in (("node1", 1.0), ("node2", 1.02), ("node3", 1.4)):
        agent = agent_of(shared, node)
        lines = [
            dumps(
                make_record(
                    "step",
                    node,
                    time.time(),
                    job="42",
                    rank=0,
                    step=s,
                    step_s=1.5,
                    compute_s=compute,
                    comm_s=1.5 - compute,
                )
            )
            for s in range(5)
        ]
        link = AgentLink(str(shared / "run" / "agent.sock"))
        assert link.send(lines, 0, store_id(shared / "store")) == 5
        link.close()
        agent.close()
    assert step_files(shared) == []
    summary = straggler_summary(shared / "store", "42", ["node1", "node2", "node3"])
    assert summary.startswith("job 42: straggler(s) node3"), summary
    assert straggler_summary(shared / "store", "42") == ""  # no rank wrote steps/42/


def test_a_busy_agent_answers_for_the_pieces_it_took_and_none_is_sent_twice(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "BATCH_LINES", 2)
    inbox = Inbox(str(shared / "run" / "agent.sock"), "node1", shared / "store", log, capacity=4)
    assert inbox.open()
    try:
        link = AgentLink(str(shared / "run" / "agent.sock"))
        lines = [_step("77", step=n) for n in range(6)]
        sid = store_id(shared / "store")
        assert link.send(lines, 0, sid) == 4  # the third piece: busy, kept by the rank
        first = inbox.take()
        assert link.send(lines[4:], 0, sid) == 2
        link.close()
    finally:
        inbox.close()
    steps_taken = [json.loads(raw)["step"] for _, raw in first + inbox.take()]
    assert steps_taken == list(range(6))
