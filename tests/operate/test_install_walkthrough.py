"""docs/operate/install.md followed step by step on the lab, as a new administrator would on a
cluster: the store, the configuration, the agents, the hooks merged with a site's own prolog, a
pass observing, a pass acting, and the uninstall that puts the cluster back.

The commands are taken from the guide's own code blocks (with the lab's paths put in for
/shared/guardctl, /etc/slurm and /usr/local/lib/guardctl), so that the guide and this test
cannot drift apart: a command the guide drops or renames fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from controltools import fleet_trace
from labtools import job_guardctl
from storetools import agent_files

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "operate" / "install.md"
TELEMETRY = REPO / "docs" / "telemetry.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def section(title: str, doc: Path = GUIDE) -> str:
    """The text of the guide's section whose heading starts with *title*, up to the next
    heading of the same or a higher level (a `#` line inside a code block is no heading)."""
    lines, fenced, level, out = doc.read_text().splitlines(), False, 0, []
    for line in lines:
        fenced ^= line.startswith("```")
        heading = re.match(r"(#+) (.*)", line) if not fenced else None
        if heading and level and len(heading.group(1)) <= level:
            break
        if level:
            out.append(line)
        elif heading and heading.group(2).startswith(title):
            level = len(heading.group(1))
    assert level, f"{doc.name} has no section {title!r}"
    return "\n".join(out) + "\n"


def blocks(text: str, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(text) if kind == lang]


def guardctl_lines(text: str) -> list[str]:
    """The `guardctl ...` command lines of a section's shell blocks, without their comments."""
    return [
        line.split("  #")[0].split(";")[0].strip()
        for body in blocks(text, "sh")
        for line in body.splitlines()
        if line.startswith("guardctl ")
    ]


def command(text: str, start: str) -> str:
    """The one guardctl command line of *text* that starts with *start*."""
    (line,) = [c for c in guardctl_lines(text) if c.startswith(start)]
    return line


def edit(text: str, old: str, new: str) -> str:
    """*text* with the guide's line *old* replaced, as the administrator edits it."""
    assert text.count(old) == 1, f"the guide's configuration no longer has {old!r}"
    return text.replace(old, new)


class Admin:
    """An administrator's shell on the lab: guardctl on PATH, /etc/guardctl/guardctl.toml
    standing in as $GUARDCTL_CONFIG (configure.md, "Where settings come from")."""

    def __init__(self, lab: Any, home: Path, subs: dict[str, str]) -> None:
        self.lab, self.home, self.subs = lab, home, subs
        self.config = home / "guardctl.toml"
        self.env = {k: v for k, v in lab.env.items() if k != "GUARDCTL_STORE"}
        self.env["GUARDCTL_CONFIG"] = str(self.config)

    def argv(self, line: str) -> list[str]:
        for old, new in self.subs.items():
            line = line.replace(old, new)
        words = shlex.split(line)
        assert words[0] == "guardctl", line
        return [sys.executable, "-m", "guardctl", *words[1:]]

    def run(
        self, line: str, *more: str, rc: tuple[int, ...] = (0,), options: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess[str]:
        """*line* as the guide writes it, *more* arguments after it, global *options* before
        its subcommand."""
        argv = self.argv(line)
        argv[3:3] = options
        proc = subprocess.run(
            [*argv, *more], env=self.env, capture_output=True, text=True, timeout=180, cwd=self.home
        )
        if os.environ.get("WALKTHROUGH_SHOW"):
            sys.stderr.write(f"$ {line} {' '.join(more)}\n{proc.stdout}{proc.stderr}\n")
        assert proc.returncode in rc, f"{line}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return proc

    def reservations(self) -> str:
        return str(self.lab.sh("scontrol", "show", "reservation").stdout)


def write_config(admin: Admin, store: Path) -> None:
    """Section 5's minimal file, with this cluster's values put in where the guide says."""
    (text,) = blocks(section("5. The configuration file"), "toml")
    tomllib.loads(text)  # the guide's example is valid as it stands
    text = edit(text, 'root = "/shared/guardctl"', f'root = "{store}"')
    text = edit(text, 'conf = ""', f'conf = "{admin.lab.conf}"')
    # Empty on the host's own Slurm; a lab of another release has its clients elsewhere.
    text = edit(text, 'bin_dir = ""', f'bin_dir = "{admin.lab.bin_dir or ""}"')
    text = edit(text, 'partition = "gpu"', 'partition = "debug"')
    # The lab's nodes have no GPUs: the prolog's GPU-count check is off (configure.md: 0).
    text = edit(text, "hook_gpus = 8", "hook_gpus = 0")
    assert tomllib.loads(text)["safety"]["observe_only"] is True  # the first week
    admin.config.write_text(text)


def start_agents(admin: Admin) -> list[subprocess.Popen[str]]:
    """One agent per node. The lab's nodes share one host, so each runs with its node name and
    a status file of its own, as docs/telemetry.md says ("Several agents on one host")."""
    line = (
        "guardctl --set agent.status_file=/run/guardctl/agent-$n.json \\\n"
        "           --set 'agent.handoff_socket=\"/run/guardctl/{node}.sock\"' agent --node $n &"
    )
    assert line in TELEMETRY.read_text()
    agents = []
    for node in admin.lab.nodes:
        words = line.replace("\\\n", " ").rstrip(" &")
        words = words.replace("/run/guardctl", str(admin.home / "run"))
        agents.append(
            subprocess.Popen(
                admin.argv(words.replace("$n", node)),
                env=admin.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                cwd=admin.home,
            )
        )
    return agents


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.3)


def held_job(lab: Any, home: Path, nodes: str) -> tuple[str, Path]:
    """A user's job running on *nodes* until its stop file appears."""
    stop = home / "stop"
    job = lab.submit(
        f"#!/bin/bash\nwhile [ ! -e {stop} ]; do sleep 0.3; done\n",
        "-N",
        str(len(nodes.split(","))),
        "-w",
        nodes,
        "-o",
        "/dev/null",
    )
    deadline = time.monotonic() + 30
    while lab.job_info(job).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, lab.job_info(job)
        time.sleep(0.2)
    return job, stop


def history(admin: Admin, line: str = "guardctl history --control") -> list[dict[str, Any]]:
    proc = admin.run(line, "--json", "--limit", "1000")
    return list(json.loads(proc.stdout)["entries"])


def test_an_administrator_installs_observes_acts_and_uninstalls(
    lab_factory: Any, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o755)  # the lab's slurmd (root, maybe in its Debian root) reads here
    store, prefix, marks = tmp_path / "shared" / "guardctl", tmp_path / "hooks", tmp_path / "marks"
    marks.mkdir(mode=0o777)
    os.chmod(marks, 0o777)
    # The cluster as found: a site's own prolog already in slurm.conf.
    site = tmp_path / "prolog.site.sh"
    site.write_text(f"#!/bin/bash\necho site >> {marks}/prolog.$SLURM_JOB_ID\n")
    site.chmod(0o755)
    lab = lab_factory(nodes=4, up_args=["--prolog", str(site)])
    admin = Admin(
        lab,
        tmp_path,
        {
            "/shared/guardctl": str(store),
            "/etc/slurm/slurm.conf": str(lab.conf),
            "/usr/local/lib/guardctl/slurm": str(prefix),
            "$(hostname -s)": "node1",
        },
    )
    before = lab.states()

    # 3. The shared store, marked once.
    admin.run(command(section("3. The shared store"), "guardctl store init"))
    assert (store / ".guardctl-store").is_file()
    assert (store / "steps").stat().st_mode & 0o7777 == 0o1777

    # 5. The configuration file; `guardctl config` validates it.
    write_config(admin, store)
    assert "`guardctl config` validates" in section("5. The configuration file")
    shown = admin.run("guardctl config").stdout
    assert str(store) in shown and str(admin.config) in shown

    # 6. The node agents: one sample now, then one agent per node.
    once = command(section("6. The node agents"), "guardctl agent --once")
    # The running agent's status file is the host's own (/run/guardctl): this one is the lab's.
    admin.run(
        once,
        "--node",
        "node1",
        options=("--set", f"agent.status_file={tmp_path / 'run' / 'agent-once.json'}"),
    )
    assert agent_files(store, "node1")
    agents = start_agents(admin)
    try:
        for node in lab.nodes:
            wait_for(tmp_path / "run" / f"agent-{node}.json")
            assert agent_files(store, node)
    finally:
        for agent in agents:
            agent.send_signal(signal.SIGTERM)
        for agent in agents:
            assert agent.wait(timeout=30) == 0, agent.stderr.read() if agent.stderr else ""

    # 7. The Slurm hooks: installed, their lines merged with the site's slurm.conf.
    hooks = section("7. The Slurm hooks")
    install = command(hooks, "guardctl install-hooks")
    assert "--prefix DIR" in hooks
    printed = admin.run(install, "--prefix", str(prefix)).stdout
    active = [ln for ln in printed.splitlines() if ln and not ln.startswith("#")]
    # The lab has PrologFlags=Alloc and a Prolog of its own: neither is replaced.
    assert not [ln for ln in active if ln.startswith(("PrologFlags=", "Prolog="))], printed
    assert f"#Prolog={prefix}/prolog.sh" in printed.splitlines()
    assert f"Epilog={prefix}/epilog.sh" in active
    assert f"HealthCheckProgram={prefix}/healthcheck.sh" in active
    # Chained as the guide says: the site's script first, then guardctl's. slurmd runs the
    # prolog with an empty environment, so the line names guardctl and its configuration.
    chain = "/usr/local/lib/guardctl/slurm/prolog.sh || exit $?"
    assert f"`{chain}`" in hooks and "GUARDCTL_CONFIG=" in hooks
    site.write_text(
        site.read_text()
        + f"GUARDCTL={job_guardctl()} GUARDCTL_CONFIG={admin.config} "
        + chain.replace("/usr/local/lib/guardctl/slurm", str(prefix))
        + "\n"
        + f"echo guardctl-passed >> {marks}/prolog.$SLURM_JOB_ID\n"
    )
    checks = json.loads(admin.run(command(hooks, "guardctl hook prolog")).stdout)
    assert checks["ok"] and {c["check"] for c in checks["checks"]} >= {"gpu_count", "xid"}
    admin.run(command(hooks, "guardctl hook healthcheck"))
    job = lab.submit("#!/bin/bash\ntrue\n", "-w", "node1", "-o", "/dev/null")
    assert lab.wait_job(job, timeout=60)["JobState"] == "COMPLETED"
    wait_for(marks / f"prolog.{job}", timeout=10)
    assert (marks / f"prolog.{job}").read_text().split() == ["site", "guardctl-passed"]

    # 8 and 10. A pass of the controller, observing: it says what it would do, changes nothing.
    # A lab cannot make a GPU slow: node2's slowness is written as telemetry, the ranks of a
    # job on node1 and node2 where node2 computes 30% longer.
    assert "`guardctl control --once`" in section("8. The controller")
    running, stop = held_job(lab, tmp_path, "node1,node2")
    fleet_trace(store, lab.nodes, slow={"node2": 1.3})
    observed = admin.run("guardctl control --once", rc=(1,))
    assert "observe only" in observed.stdout and "node2" in observed.stdout
    assert "guardctl_" not in admin.reservations()
    assert not [s for s in lab.sh("sinfo", "-h", "-o", "%T").stdout.split() if "drain" in s]
    week = section("10. A first week")
    assert "`guardctl history --control`" in week and "`guardctl status`" in week
    (would,) = [e for e in history(admin) if e["action"] == "control decision"]
    assert (would["nodes"], would["evidence"]["outcome"]) == (["node2"], "would do")
    assert not [e for e in history(admin, "guardctl history") if e["action"] == "quarantine"]
    assert "`guardctl control --explain NODE`" in week
    assert re.search(r"node2\s+mixed\s+in service", admin.run("guardctl status").stdout)
    explained = admin.run("guardctl control --explain node2").stdout
    assert "decision: quarantine (rung b)" in explained, explained

    # 11. Acting: the two settings the guide names, then the next pass.
    (acting,) = blocks(section("11. Acting"), "toml")
    assert tomllib.loads(acting) == {"safety": {"observe_only": False}, "control": {"act": True}}
    admin.config.write_text(
        edit(admin.config.read_text(), "observe_only = true", "observe_only = false")
        + "\n[control]\nact = true\n"
    )
    admin.run("guardctl control --once", rc=(0, 1))
    assert "guardctl_q_node2" in admin.reservations()
    assert lab.job_info(running)["JobState"] == "RUNNING"  # the user's job goes on
    decisions = [e for e in history(admin) if e["action"] == "control decision"]
    assert decisions[-1]["evidence"]["decision"] == "quarantine"

    # Upgrade, step 2, with nothing new: the same scripts, the same lines.
    upgrade = section("Upgrade")
    again = (
        "guardctl install-hooks --prefix /usr/local/lib/guardctl/slurm --slurm-conf "
        "/etc/slurm/slurm.conf"
    )
    assert again in " ".join(upgrade.split())
    upgraded = admin.run(again).stdout
    assert upgraded.count("# unchanged:") == 4
    assert [ln for ln in upgraded.splitlines() if ln and not ln.startswith("#")] == active

    # Uninstall: the controller is not running (a --once pass); listed first, then undone.
    steps = section("Uninstall")
    assert "`guardctl uninstall --dry-run`" in steps and "`guardctl uninstall`" in steps
    listed = admin.run("guardctl uninstall --dry-run").stdout
    assert "guardctl_q_node2" in listed and "guardctl_q_node2" in admin.reservations()
    admin.run("guardctl uninstall")
    assert "guardctl_" not in admin.reservations()
    stop.touch()
    lab.wait_job(running, timeout=30)
    lab.wait_idle(timeout=30)
    assert lab.states() == before
    done = [e["action"] for e in history(admin, "guardctl history") if e["phase"] == "done"]
    assert [a for a in done if a in ("quarantine", "release")] == ["quarantine", "release"]
