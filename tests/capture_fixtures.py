"""Capture the Slurm fixtures of tests/fixtures/slurm-<release>/ from a real lab.

    GUARDCTL_LAB_RELEASE=24.11 python3 tests/capture_fixtures.py [--only blocked|topology]

Starts a private 6-node lab of that release and puts it in every state the
parser must know: node1 runs a job, node2 is drained (and a job pending on
it), node3 is in a plain reservation (RESERVED), node4 in a maintenance
reservation (MAINTENANCE+RESERVED), node5 is set DOWN, node6 stays idle.
On 24.11 and newer a second, 4-node lab puts every node in one topology block
(topology/block) and runs an ``--exclusive=topo`` job on node1, which leaves
node2-node4 BLOCKED (``blocked/``).  ``topology/`` holds what ``scontrol show topology``
prints with no topology plugin, a topology/tree of two spine groups over three leaves, and
(24.11 and newer) a topology/block of two blocks in one aggregation, each from a lab of its own
(``--only topology`` captures just these).  Then it saves each read command's output
(its default JSON, and each data_parser version the release accepts) with the
lab's paths, host name and cluster name replaced by fixed words, so the files
name no machine.  A command the release does not have is written down in ``unsupported.txt``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from labtools import Lab, lab_release

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# data_parser plugins that Slurm 23.11-26.05 may ship; each release accepts a window of them.
PARSERS = ("v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
READS = {
    "sinfo": ("sinfo",),
    "squeue": ("squeue",),
    "scontrol_nodes": ("scontrol", "show", "node"),
    "scontrol_jobs": ("scontrol", "show", "job"),
    "scontrol_reservations": ("scontrol", "show", "reservation"),
}


def scrub(text: str, lab: Lab) -> str:
    """Replace what names this machine or this lab run with fixed words."""
    host = socket.gethostname().split(".")[0]
    pairs = [(str(lab.dir), "/srv/lab"), (f"job-{os.getpid()}-", "job-"), (lab.cluster, "lab")]
    for old, new in pairs:
        # 22.05 writes "/" as "\/" in its JSON.
        text = text.replace(old, new).replace(old.replace("/", "\\/"), new.replace("/", "\\/"))
    # The host name appears as a JSON string and inside hostlists; never replace inside words.
    return text.replace(f'"{host}"', '"labhost"').replace(f"{host}(", "labhost(")


def set_states(lab: Lab) -> None:
    lab.sh("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=admin: bad dimm")
    lab.sh(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=plain",
        "Nodes=node3",
        "Users=root",
        "StartTime=now",
        "Duration=infinite",
    )
    lab.sh(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=guardctl_q_node4",
        "Nodes=node4",
        "Users=root",
        "StartTime=now",
        "Duration=infinite",
        "Flags=MAINT,IGNORE_JOBS",
    )
    lab.sh("scontrol", "update", "NodeName=node5", "State=DOWN", "Reason=admin: psu")
    lab.submit("#!/bin/bash\nsleep 300\n", "-w", "node1", "-J", "running")
    lab.submit("#!/bin/bash\nsleep 300\n", "-w", "node2", "-J", "pending")
    lab.wait_states({"node1": ("allocated", "mixed")}, timeout=30)
    time.sleep(2)  # let the scheduler give the pending job its reason


def capture(lab: Lab, out: Path, reads: dict[str, tuple[str, ...]] = READS) -> list[str]:
    unsupported = []
    (out / "version.txt").write_text(lab.sh("sinfo", "--version").stdout)
    for name, argv in reads.items():
        for parser in ("", *PARSERS):
            flag = f"--json={parser}" if parser else "--json"
            proc = lab.sh(*argv[:1], flag, *argv[1:], check=False)
            try:
                json.loads(proc.stdout)
                ok = proc.returncode == 0
            except ValueError:
                ok = False
            label = f"{name}{'.' + parser if parser else ''}.json"
            if ok:
                (out / label).write_text(scrub(proc.stdout, lab))
            else:
                why = " ".join((proc.stderr or proc.stdout).split())[:160]
                unsupported.append(f"{' '.join(argv[:1])} {flag} {' '.join(argv[1:])}: {why}")
                if not parser:
                    break  # no JSON at all: no version of it either
    (out / "reservations.txt").write_text(
        scrub(lab.sh("scontrol", "show", "-o", "reservation").stdout, lab)
    )
    (out / "nodes.txt").write_text(scrub(lab.sh("scontrol", "show", "-o", "node").stdout, lab))
    (out / "unsupported.txt").write_text("\n".join(unsupported) + "\n")
    return unsupported


def capture_blocked(out: Path) -> list[str]:
    """node2-node4 BLOCKED beside an exclusive-topology job (topology/block, 24.05+)."""
    with tempfile.TemporaryDirectory() as tmp:
        extra, topology = Path(tmp, "block.conf"), Path(tmp, "topology.conf")
        extra.write_text("TopologyPlugin=topology/block\n")
        topology.write_text("BlockName=b1 Nodes=node[1-4]\nBlockSizes=4\n")
        lab = Lab.start(nodes=4, up_args=["--conf-extra", str(extra), "--topology", str(topology)])
        try:
            lab.submit(
                "#!/bin/bash\nsleep 300\n", "-w", "node1", "-J", "exclusive", "--exclusive=topo"
            )
            deadline = time.monotonic() + 30
            while "blocked" not in lab.sh("sinfo", "-h", "-n", "node2", "-o", "%T").stdout:
                if time.monotonic() > deadline:
                    raise TimeoutError("node2 never became BLOCKED")
                time.sleep(0.5)
            return capture(lab, out, {k: READS[k] for k in ("sinfo", "scontrol_nodes")})
        finally:
            with contextlib.suppress(subprocess.CalledProcessError, TimeoutError):
                lab.cancel_all_jobs()
            lab.down(purge=True, check=False)


# topology.conf of the tree lab: leaves s1, s2 under spine s10, leaf s3 under spine s11, root s0.
TREE = """SwitchName=s1 Nodes=node[1-2]
SwitchName=s2 Nodes=node[3-4]
SwitchName=s3 Nodes=node[5-6]
SwitchName=s10 Switches=s[1-2]
SwitchName=s11 Switches=s3
SwitchName=s0 Switches=s[10-11]
"""
BLOCKS = "BlockName=b1 Nodes=node[1-2]\nBlockName=b2 Nodes=node[3-4]\nBlockSizes=2,4\n"


def capture_topology(out: Path) -> list[str]:
    """``scontrol show topology`` of each plugin the release has (topology/<plugin>.txt)."""
    out.mkdir(parents=True, exist_ok=True)
    plugins = {"none": ("", "", 2), "tree": ("topology/tree", TREE, 6)}
    if tuple(int(p) for p in lab_release().split(".")) >= (24, 11):
        plugins["block"] = ("topology/block", BLOCKS, 4)
    unsupported = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (plugin, conf, nodes) in plugins.items():
            up_args: list[str] = []
            if plugin:
                Path(tmp, f"{name}.extra").write_text(f"TopologyPlugin={plugin}\n")
                Path(tmp, f"{name}.topology").write_text(conf)
                up_args = [
                    "--conf-extra",
                    f"{tmp}/{name}.extra",
                    "--topology",
                    f"{tmp}/{name}.topology",
                ]
            lab = Lab.start(nodes=nodes, up_args=up_args)
            try:
                (out / "version.txt").write_text(lab.sh("sinfo", "--version").stdout)
                proc = lab.sh("scontrol", "show", "topology", check=False)
                (out / f"{name}.txt").write_text(scrub(proc.stdout, lab))
                (out / f"{name}.stderr.txt").write_text(scrub(proc.stderr, lab))
                as_json = lab.sh("scontrol", "--json", "show", "topology", check=False)
                try:
                    json.loads(as_json.stdout)
                except ValueError:
                    why = " ".join(as_json.stderr.split())[:160]
                    if as_json.returncode == 0:
                        why = "accepted, but prints the text form (no JSON)"
                    unsupported.append(f"scontrol --json show topology ({name}): {why}")
            finally:
                lab.down(purge=True, check=False)
    (out / "unsupported.txt").write_text("\n".join(unsupported) + "\n")
    return unsupported


def main() -> int:
    release = lab_release()
    out = FIXTURES / f"slurm-{release}"
    missing: list[str] = []
    if sys.argv[1:] == ["--only", "topology"]:
        missing += capture_topology(out / "topology")
        print(f"captured Slurm {release}'s topology; {len(missing)} forms unsupported")
        return 0
    if sys.argv[1:] != ["--only", "blocked"]:
        out.mkdir(exist_ok=True)
        lab = Lab.start(nodes=6)
        try:
            set_states(lab)
            missing += capture(lab, out)
        finally:
            with contextlib.suppress(subprocess.CalledProcessError, TimeoutError):
                lab.cancel_all_jobs()
            lab.down(purge=True, check=False)
    if sys.argv[1:] != ["--only", "blocked"]:
        missing += capture_topology(out / "topology")
    if tuple(int(p) for p in release.split(".")) >= (24, 11):
        (out / "blocked").mkdir(parents=True, exist_ok=True)
        missing += capture_blocked(out / "blocked")
    print(
        f"captured Slurm {release} into {out.relative_to(FIXTURES.parent.parent)}; "
        f"{len(missing)} command/parser pairs unsupported"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
