"""guardctl install-hooks: the scripts from the package into a directory, the slurm.conf lines
merged with a site's own; the scripts safe to chain with a site's; the epilog's summary in
syslog even when it passes."""

from __future__ import annotations

import os
import subprocess
import sys
import syslog
import time
from pathlib import Path
from typing import Any

import pytest
from hooktools import write_straggler_job
from labtools import job_guardctl

from guardctl.config import load_settings
from guardctl.errors import ExitCode
from guardctl.hooks.install import SCRIPTS, conf_lines, merged_flags, read_conf
from guardctl.hooks.run import run_hook
from guardctl.storage import store as shared_store

REPO = Path(__file__).resolve().parents[2]
GUARDCTL = str(Path(sys.executable).parent / "guardctl")
SYSFS = REPO / "tests" / "fixtures" / "sysfs" / "ib8"


def install_hooks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "guardctl", "install-hooks", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def conf_keys(stdout: str) -> dict[str, list[str]]:
    """The active (uncommented) lines printed, as slurm.conf would read them."""
    found: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_installs_the_scripts_and_prints_the_lines(tmp_path: Path) -> None:
    prefix = tmp_path / "lib" / "slurm"
    dry = install_hooks("--prefix", str(prefix), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not prefix.exists() and "# would install:" in dry.stdout
    proc = install_hooks("--prefix", str(prefix))
    assert proc.returncode == 0, proc.stderr
    for name in SCRIPTS:
        assert (prefix / name).read_bytes() == (REPO / "slurm" / name).read_bytes()
        assert (prefix / name).stat().st_mode & 0o777 == 0o755
    assert conf_keys(proc.stdout) == {
        "PrologFlags": ["Alloc"],
        "Prolog": [f"{prefix}/prolog.sh"],
        "Epilog": [f"{prefix}/epilog.sh"],
        "HealthCheckProgram": [f"{prefix}/healthcheck.sh"],
        "HealthCheckInterval": ["300"],
        "HealthCheckNodeState": ["ANY,CYCLE"],
    }
    again = install_hooks("--prefix", str(prefix))  # an upgrade with nothing new
    assert again.stdout.count("# unchanged:") == len(SCRIPTS)


def test_an_upgrade_replaces_an_older_script(tmp_path: Path) -> None:
    prefix = tmp_path / "hooks"
    assert install_hooks("--prefix", str(prefix)).returncode == 0
    (prefix / "epilog.sh").write_text("#!/bin/bash\n# guardctl's epilog, an older release\n")
    proc = install_hooks("--prefix", str(prefix))
    assert f"# replace: {prefix / 'epilog.sh'}" in proc.stdout
    assert (prefix / "epilog.sh").read_bytes() == (REPO / "slurm" / "epilog.sh").read_bytes()


def test_never_overwrites_a_sites_own_script(tmp_path: Path) -> None:
    (tmp_path / "prolog.sh").write_text("#!/bin/bash\n/usr/sbin/site-checks\n")
    proc = install_hooks("--prefix", str(tmp_path))
    assert proc.returncode == ExitCode.REFUSED
    assert proc.stderr.count("\n") == 1 and "not one of guardctl's" in proc.stderr
    assert (tmp_path / "prolog.sh").read_text() == "#!/bin/bash\n/usr/sbin/site-checks\n"
    assert not (tmp_path / "hook.sh").exists()  # refused before the first copy


@pytest.mark.parametrize(
    ("site", "line"),
    [
        ("", "PrologFlags=Alloc"),
        ("PrologFlags=NoHold,Serial", "PrologFlags=Alloc,NoHold,Serial"),
        ("PrologFlags=Contain,X11", ""),  # Contain and X11 imply Alloc: the site's line stays
        ("prologflags=alloc", ""),
    ],
)
def test_prolog_flags_are_merged_never_replaced(site: str, line: str) -> None:
    assert merged_flags([site.partition("=")[2]] if site else [])[0] == line


def test_a_sites_prolog_and_nhc_are_kept_and_chained(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=lab  # a comment\nPrologFlags=Contain,X11\n"
        "Prolog=/etc/slurm/prolog.site.sh\nHealthCheckProgram=/usr/sbin/nhc\n"
        "HealthCheckInterval=600\n"
    )
    prefix = tmp_path / "hooks"
    proc = install_hooks("--prefix", str(prefix), "--slurm-conf", str(conf), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    active = conf_keys(proc.stdout)
    # Pasted below the site's lines, none of these replaces a value of the site's.
    assert active == {"Epilog": [f"{prefix}/epilog.sh"], "HealthCheckNodeState": ["ANY,CYCLE"]}
    assert f"#Prolog={prefix}/prolog.sh" in proc.stdout.splitlines()
    assert f"#HealthCheckProgram={prefix}/healthcheck.sh" in proc.stdout.splitlines()
    assert "PrologFlags=Contain,X11 already runs the prolog at allocation" in proc.stdout
    assert read_conf(conf)["prolog"] == ["/etc/slurm/prolog.site.sh"]
    upgraded = conf_lines(prefix, {**read_conf(conf), "epilog": [f"{prefix}/epilog.sh"]})
    assert f"# Epilog={prefix}/epilog.sh is set already: no change" in upgraded


def test_scripts_chain_run_or_sourced_and_keep_stdout_clean(tmp_path: Path) -> None:
    cfg = tmp_path / "g.toml"
    store = tmp_path / "store"
    shared_store.init(store)
    cfg.write_text(
        f'[store]\nroot = "{store}"\n[slurm]\nconf = ""\n[agent]\nsysfs_root = "{SYSFS}"\n'
    )
    for how in ("", ". "):  # run as a program, and sourced by the site's script
        site = tmp_path / "site-prolog.sh"
        site.write_text(
            "#!/bin/bash\necho site-before >&2\n"
            f"{how}{REPO / 'slurm' / 'prolog.sh'}\nstatus=$?\n"
            "echo site-after $status >&2\nexit $status\n"
        )
        proc = subprocess.run(
            [
                "env",
                "-i",
                f"GUARDCTL={GUARDCTL}",
                f"GUARDCTL_CONFIG={cfg}",
                "SLURMD_NODENAME=node1",
                "/bin/bash",
                str(site),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, (how, proc.stderr)
        assert proc.stdout == "", how  # nothing on stdout for a wrapper to trip over
        assert "site-after 0" in proc.stderr, (how, proc.stderr)


def test_the_straggler_summary_reaches_syslog_when_the_epilog_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    write_straggler_job(root)
    logged: list[tuple[int, str]] = []
    # The boundary: syslog(3) itself (no syslog daemon in the test machine to read back).
    monkeypatch.setattr(syslog, "syslog", lambda priority, line: logged.append((priority, line)))
    settings = load_settings(
        environ={"GUARDCTL_STORE": str(root)},
        assignments=[f"agent.sysfs_root={SYSFS}", "sweep.hook_gpus=0"],
    )
    report = run_hook(settings, "epilog", environ={"SLURM_JOB_ID": "42"}, node="node3", nvml=None)
    assert not report.failed and not report.fails  # the epilog passes
    assert logged == [
        (
            syslog.LOG_INFO,
            "guardctl epilog node3: job 42: straggler(s) node3; "
            "slowest node3 compute 1.4 s vs job median 1.02 s",
        )
    ]


def test_installed_hooks_chained_with_a_sites_prolog_in_a_lab(
    lab_factory: Any, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o755)
    prefix = tmp_path / "hooks"
    assert install_hooks("--prefix", str(prefix)).returncode == 0
    store = tmp_path / "store"
    shared_store.init(store)
    cfg = tmp_path / "g.toml"
    marks = tmp_path / "marks"
    marks.mkdir(mode=0o777)
    os.chmod(marks, 0o777)
    # The site's prolog: its own step, then guardctl's installed one, the first failure wins.
    site = tmp_path / "site-prolog.sh"
    site.write_text(
        "#!/bin/bash\n"
        f"echo site >> {marks}/prolog.$SLURM_JOB_ID\n"
        f"GUARDCTL={job_guardctl()} GUARDCTL_CONFIG={cfg} {prefix}/prolog.sh "
        "|| exit $?\n"
        f"echo guardctl-passed >> {marks}/prolog.$SLURM_JOB_ID\n"
    )
    site.chmod(0o755)
    lab = lab_factory(nodes=2, up_args=["--prolog", str(site)])
    cfg.write_text(
        f'[store]\nroot = "{store}"\n[slurm]\n{lab.slurm_toml()}[agent]\nsysfs_root = "{SYSFS}"\n'
    )
    job = lab.submit("#!/bin/bash\necho ran\n", "-w", "node1", "-o", "/dev/null")
    assert lab.wait_job(job, timeout=60)["JobState"] == "COMPLETED"
    deadline = time.monotonic() + 10
    while not (marks / f"prolog.{job}").exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert (marks / f"prolog.{job}").read_text().split() == ["site", "guardctl-passed"]
    assert "DRAIN" not in lab.node_state("node1")["state_flags"]
