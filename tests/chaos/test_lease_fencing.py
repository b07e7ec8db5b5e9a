"""A leader paused past its lease, and controllers whose wall clocks are minutes apart.

The lease is judged on each process's own monotonic clock, and every change to Slurm and every
log entry is fenced by it. A test clock stands for a host's clocks: its monotonic clock is
moved on by hand for the time a process was stopped or waited, its wall clock skewed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from controltools import fleet_trace
from sweepchaos import NODES, quarantined, settings, sweep_jobs

from guardctl.clock import Clock
from guardctl.controller.lease import Lease, LeaseLost
from guardctl.controller.loop import Controller
from guardctl.errors import RefusedError
from guardctl.nodeops import NodeOps
from guardctl.slurm.memory import MemorySlurm
from guardctl.slurm.types import SlurmClient, SubmitRequest
from guardctl.sweep.engine import SweepOptions

LEASE = 60.0


class HostClock(Clock):
    """One host's clocks: the wall clock *skew_s* off; the monotonic one moved on by hand."""

    def __init__(self, name: str, skew_s: float = 0.0) -> None:
        super().__init__()
        self.boot = f"test-{name}"  # its own monotonic clock, not this machine's
        self.skew_s = skew_s
        self.passed = 0.0

    def wall(self) -> float:
        return time.time() + self.skew_s

    def mono(self) -> float:
        return time.monotonic() + self.passed


def controller(tmp_path: Path, slurm: MemorySlurm, clock: HostClock) -> Controller:
    c = Controller(
        settings(tmp_path, lease_s=LEASE, interval_s=10.0), act=True, slurm=slurm, clock=clock
    )
    c.as_daemon(10.0)
    return c


def test_a_leader_paused_past_its_lease_wakes_mid_pass_and_changes_nothing(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    ca, cb = HostClock("a"), HostClock("b")
    a, b = controller(tmp_path, slurm, ca), controller(tmp_path, slurm, cb)
    first = next(d for d in a.run_pass().decisions if d["node"] == "node2")
    assert (first["decision"], first["outcome"]) == ("quarantine", "sweep started"), first
    a_jobs = [j.job_id for j in sweep_jobs(slurm, "node2")]
    assert a_jobs
    assert not b.run_pass().leader  # B sees the lease for the first time: it waits

    real_analysis = a.analysis
    seen: dict[str, object] = {}

    def stopped_here():  # type: ignore[no-untyped-def]
        got = real_analysis()
        assert not b.run_pass().leader  # B sees A's renewal of this pass
        ca.passed += LEASE + 5  # A is stopped (SIGSTOP, a VM migration) past its lease...
        cb.passed += LEASE + 5  # ...while B, watching all along, sees no renewal
        report = b.run_pass()
        seen["b"] = report
        seen["entries"] = len(a.ops.log.entries())
        seen["b_jobs"] = [j.job_id for j in sweep_jobs(slurm, "node2")]
        return got

    a.analysis = stopped_here  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        a.run_pass()  # A wakes and goes on with its pass: its first change is fenced
    assert seen["b"].leader  # type: ignore[attr-defined]
    b_jobs = seen["b_jobs"]
    assert b_jobs and not set(a_jobs) & set(b_jobs)  # type: ignore[arg-type]
    # B's clean-up cancelled A's sweep jobs; A touched nothing of B's: its jobs still run.
    assert {slurm.job(j).state for j in a_jobs} == {"CANCELLED"}  # type: ignore[union-attr]
    assert [j.job_id for j in sweep_jobs(slurm, "node2")] == b_jobs
    assert quarantined(slurm, "node2")
    assert len(a.ops.log.entries()) == seen["entries"]  # not one entry from A after its pause

    a.analysis = real_analysis  # type: ignore[method-assign]
    later = a.run_pass()  # A observes from now on
    assert not later.leader and "another controller leads" in later.held_back
    assert not a.sweeps.running
    assert [j.job_id for j in sweep_jobs(slurm, "node2")] == b_jobs
    assert len(a.ops.log.entries()) == seen["entries"]
    b.run_pass()  # B polls its own sweep, which still runs
    assert [j.job_id for j in sweep_jobs(slurm, "node2")] == b_jobs
    assert list(b.sweeps.running) == ["node2"]


def test_a_leader_paused_past_its_lease_notices_it_though_nobody_took_it(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    clock = HostClock("a")
    a = controller(tmp_path, slurm, clock)
    assert a.lead()[0]
    real_analysis = a.analysis

    def stopped_here():  # type: ignore[no-untyped-def]
        got = real_analysis()
        clock.passed += LEASE  # a long GC, a hung NFS read
        return got

    a.analysis = stopped_here  # type: ignore[method-assign]
    with pytest.raises(LeaseLost, match="ran out by its own clock"):
        a.run_pass()
    assert slurm.reservations() == [] and a.ops.log.entries() == []
    # An operator's one-off command is not a controller: no lease fences it.
    operator = NodeOps(a.settings, slurm)
    assert operator.quarantine(["node5"], "ops: suspect cable")[0].outcome == "done"
    a.analysis = real_analysis  # type: ignore[method-assign]
    # Nobody renewed it for lease_s, by A's own clock: A takes it again, as a new tenure.
    token = a.lease.token
    report = a.run_pass()
    assert report.leader and a.lease.token != token
    assert quarantined(slurm, "node2")


def test_a_deposed_leader_neither_appends_to_nor_checkpoints_the_log(tmp_path: Path) -> None:
    slurm = MemorySlurm(NODES, start=time.time())
    clock = HostClock("a")
    a = controller(tmp_path, slurm, clock)
    assert a.lead()[0]
    a.ops.record("control pass", ["node1"])
    before = a.ops.log.path.read_bytes()
    clock.passed += LEASE  # paused past its lease
    with pytest.raises(LeaseLost):
        a.ops.record("control pass", ["node2"])
    with pytest.raises(LeaseLost):
        a.ops.log.checkpoint(lambda entries: [])  # it would have dropped every entry
    assert a.ops.log.path.read_bytes() == before
    assert not (a.ops.log.path.parent / "archive").exists()


def test_a_deposed_leader_reaches_slurm_only_through_the_protocol_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """The fenced client offers what guardctl's Slurm protocol names and nothing else (the
    in-memory Slurm's own levers, which change it, stay out of a controller's reach), and
    every change it offers but the hold's release is refused once the lease is gone."""
    slurm = MemorySlurm(NODES, start=time.time())
    clock = HostClock("a")
    a = controller(tmp_path, slurm, clock)
    assert a.lead()[0]
    fenced = a.ops.slurm
    protocol = {name for name in vars(SlurmClient) if not name.startswith("_")}
    assert {name for name in vars(type(fenced)) if not name.startswith("_")} == protocol
    for lever in ("set_down", "finish", "add_node", "advance"):
        assert hasattr(slurm, lever) and not hasattr(fenced, lever)
    job = fenced.submit(SubmitRequest(script="burnin.sh", nodes=(NODES[0],)))
    clock.passed += LEASE  # paused past its lease
    changes = {
        "drain": lambda: fenced.drain([NODES[1]], "deposed"),
        "resume": lambda: fenced.resume([NODES[1]]),
        "create_reservation": lambda: fenced.create_reservation("r", [NODES[1]], ["root"]),
        "delete_reservation": lambda: fenced.delete_reservation("r"),
        "submit": lambda: fenced.submit(SubmitRequest(script="burnin.sh")),
        "cancel": lambda: fenced.cancel(job),
        "requeue": lambda: fenced.requeue(job, hold=True),
        "update_job": lambda: fenced.update_job(job, exclude=[NODES[1]]),
        "signal": lambda: fenced.signal(job, "USR1"),
    }
    before = (slurm.nodes(), slurm.jobs(), slurm.reservations())
    for name, change in changes.items():
        with pytest.raises(LeaseLost):
            change()
        assert (slurm.nodes(), slurm.jobs(), slurm.reservations()) == before, name
    reads = {"nodes", "jobs", "recent_jobs", "reservations", "topology", "job"}
    assert protocol == reads | set(changes) | {"release_hold"}


@pytest.mark.parametrize("skew_s", [300.0, -300.0])
def test_skewed_controllers_never_take_a_fresh_lease_and_fail_over_in_lease_s(
    tmp_path: Path, skew_s: float
) -> None:
    ca, cb = HostClock("a"), HostClock("b", skew_s)  # B's wall clock minutes ahead or behind
    a = Lease(tmp_path, LEASE, clock=ca)
    b = Lease(tmp_path, LEASE, clock=cb)
    assert a.acquire()[0]
    assert not b.acquire()[0]  # renewed a moment ago: whatever B's wall clock says
    for _ in range(3):  # A renews within its lease; B never sees lease_s without a renewal
        ca.passed += LEASE * 0.6
        cb.passed += LEASE * 0.6
        assert a.acquire()[0]
        assert not b.acquire()[0]
    # A stops renewing (it died on another host): B takes over lease_s later by its own clock.
    cb.passed += LEASE * 0.99
    assert not b.acquire()[0]
    cb.passed += LEASE * 0.02
    held, holder = b.acquire()
    assert held and holder is not None and holder.token == b.token
    ca.passed += LEASE * 1.01
    with pytest.raises(LeaseLost):
        a.check()
    assert not a.acquire()[0]  # A, back, sees B's fresh lease: it observes


def test_one_off_passes_on_one_host_add_up_their_watching(tmp_path: Path) -> None:
    holder, host = HostClock("a"), HostClock("b")
    assert Lease(tmp_path, LEASE, clock=holder).acquire()[0]  # then its host died
    assert not Lease(tmp_path, LEASE, clock=host).acquire()[0]  # a --once pass sees it
    host.passed += LEASE
    assert Lease(tmp_path, LEASE, clock=host).acquire()[0]  # the next one, lease_s later


def test_never_two_sweeps_of_one_node(tmp_path: Path) -> None:
    fleet_trace(tmp_path, NODES)
    slurm = MemorySlurm(NODES, start=time.time())
    c = controller(tmp_path, slurm, HostClock("a"))
    assert c.lead()[0]
    options = SweepOptions(kind="single", duration_s=2.0)
    first = c.sweeps.start(c.settings, "node3", options, 0, False, "suspect")
    assert c.sweeps.poll(first) is None
    jobs = [j.job_id for j in sweep_jobs(slurm, "node3")]
    with pytest.raises(RefusedError, match="runs already"):
        c.sweeps.start(c.settings, "node3", options, 0, False, "again")
    assert c.sweeps.running["node3"] is first  # not orphaned by a second one
    # Another controller's sweep open in the log: not duplicated either.
    c.ops.record(
        "control sweeping",
        ["node4"],
        reason="sweep S9 started",
        evidence={"by": "control", "sweep": "S9"},
    )
    with pytest.raises(RefusedError, match="open in the action log"):
        c.sweeps.start(c.settings, "node4", options, 0, False, "suspect")
    assert [j.job_id for j in sweep_jobs(slurm, "node3")] == jobs
    assert sweep_jobs(slurm, "node4") == [] and not quarantined(slurm, "node4")
    assert [e.evidence["sweep"] for e in c.ops.log.entries() if e.action == "control sweeping"] == [
        first.sweep_id,
        "S9",
    ]


def test_a_long_pass_keeps_its_lease_by_renewing_at_its_changes(tmp_path: Path) -> None:
    ca, cb = HostClock("a"), HostClock("b")
    a, b = Lease(tmp_path, LEASE, clock=ca), Lease(tmp_path, LEASE, clock=cb)
    assert a.acquire()[0] and not b.acquire()[0]
    for _ in range(4):  # changes to Slurm every half lease, no renewal between passes
        ca.passed += LEASE * 0.5
        cb.passed += LEASE * 0.5
        a.check()  # the fence renews what is a third used
        assert not b.acquire()[0]
    assert a.read().renewals == 4  # type: ignore[union-attr]


def test_a_pass_judges_freshness_by_its_own_hosts_clock(tmp_path: Path) -> None:
    # A host whose clock runs an hour ahead of the nodes' sees their newest window an hour
    # old: the pass decides nothing on it, and says so, rather than acting on the records as
    # fresh by another reading of the time than the one its log and lease use.
    fleet_trace(tmp_path, NODES, slow={"node2": 1.3})
    slurm = MemorySlurm(NODES, start=time.time())
    said: list[str] = []
    c = Controller(
        settings(tmp_path, lease_s=LEASE, interval_s=10.0),
        act=True,
        slurm=slurm,
        clock=HostClock("ahead", skew_s=3600.0),
        progress=said.append,
    )
    c.as_daemon(10.0)
    report = c.run_pass()
    assert not report.decisions, report.decisions
    assert any("stale telemetry" in line for line in said), said
    assert not quarantined(slurm, "node2") and not sweep_jobs(slurm, "node2")
