"""A real ``guardctl control`` daemon SIGSTOPped past its lease on the lab, while a second one
takes over, then SIGCONTed: it changes nothing in Slurm and writes nothing to the action log,
and the new leader's sweep runs to its verdict."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from controltools import control_guardctl, fleet_trace

NODES = ["node1", "node2", "node3", "node4"]
LEASE_S = 8.0


def entries(g: Any) -> list[dict[str, Any]]:
    out = g("history", "--json", "--limit", "1000")
    return list(json.loads(out.stdout)["entries"])


def wait_for(
    g: Any, what: str, until: float, proc: subprocess.Popen[str], **match: Any
) -> dict[str, Any]:
    while True:
        found = [
            e
            for e in entries(g)
            if e["action"] == what
            and all(e.get(k, e["evidence"].get(k)) == v for k, v in match.items())
        ]
        if found:
            return found[-1]
        assert time.monotonic() < until and proc.poll() is None, (what, proc.poll())
        time.sleep(0.3)


def test_a_daemon_stopped_past_its_lease_wakes_and_leaves_the_new_leader_be(
    lab: Any, tmp_path: Path
) -> None:
    g = control_guardctl(
        tmp_path, lab, control=f"lease_s = {LEASE_S}\ninterval_s = 1.0\nsweep_duration_s = 15.0\n"
    )
    fleet_trace(g.store, NODES, slow={"node2": 1.3})
    old = g.popen("control", "--act")
    new: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 120
        first = wait_for(g, "control sweeping", deadline, old, pid=old.pid)
        old.send_signal(signal.SIGSTOP)  # a VM migration, a hung NFS server: it just stops
        stopped = time.time()
        new = g.popen("control", "--act")
        second = wait_for(g, "control sweeping", deadline, new, pid=new.pid)
        assert second["evidence"]["sweep"] != first["evidence"]["sweep"]
        assert time.time() - stopped >= LEASE_S  # the new leader waited out the lease
        woke = time.time()
        old.send_signal(signal.SIGCONT)
        time.sleep(4)  # several of its passes, had it gone on acting
        judged = wait_for(g, "control sweep", deadline + 60, new, sweep=second["evidence"]["sweep"])
        assert judged["pid"] == new.pid and judged["evidence"]["verdict"] != "aborted", judged
        log = entries(g)
        # The old leader's own sweep was closed by the new leader, its jobs cancelled...
        closed = [
            e
            for e in log
            if e["action"] == "control sweep"
            and e["evidence"].get("sweep") == first["evidence"]["sweep"]
        ]
        assert [(e["pid"], e["evidence"]["verdict"]) for e in closed] == [(new.pid, "aborted")]
        # ...and after it woke, the old leader wrote nothing and cancelled nothing.
        assert [e for e in log if e["pid"] == old.pid and e["ts"] >= stopped] == []
        assert not [
            e
            for e in log
            if e["action"] == "sweep aborted"
            and e["evidence"].get("sweep") == second["evidence"]["sweep"]
        ]
        assert woke > stopped
    finally:
        for p in (old, new):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=60) for p in (old, new) if p is not None]
    assert "another controller leads" in outs[0][0] + outs[0][1], outs[0]
