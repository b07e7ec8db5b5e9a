"""`guardctl config` prints TOML that reads back to the same settings, each value's source named."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from guardctl.cli.config_cmd import toml_value
from guardctl.config import Layer, build_settings, load_settings
from guardctl.errors import ExitCode

SITE = """\
[safety]
max_out_nodes = 5
observe_only = true
[sweep]
references = { "gemm|NVIDIA H200" = { lower = -0.05, floor = 700 } }
inject = { node3 = 0.5 }
[agent]
timeouts = { nvml = 5.0 }
collectors = ["nvml", "host"]
"""


def guardctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "guardctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GUARDCTL", "SLURM"))}
    return {**env, **extra}


def test_config_prints_toml_that_reads_back_to_the_same_settings(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(SITE)
    args = ("--config", str(site), "--set", "slurm.timeout_s=7", "--set", "sweep.pairing=two_round")
    proc = guardctl(*args, "config", env=clean_env(GUARDCTL_STORE=str(tmp_path / "store")))
    assert proc.returncode == 0, proc.stderr
    printed = tomllib.loads(proc.stdout)  # valid TOML: true/false, not True/False
    assert printed["safety"]["observe_only"] is True
    assert printed["safety"]["max_out_nodes"] == 5

    expected = load_settings(
        [site],
        ["slurm.timeout_s=7", "sweep.pairing=two_round"],
        environ={"GUARDCTL_STORE": str(tmp_path / "store")},
    )
    again = build_settings([Layer("printed", printed)])
    assert dataclasses.replace(again, sources=()) == dataclasses.replace(expected, sources=())


def test_each_value_names_where_it_came_from(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(SITE)
    proc = guardctl(
        "--config",
        str(site),
        "--set",
        "slurm.timeout_s=7",
        "config",
        env=clean_env(GUARDCTL_STORE=str(tmp_path / "store")),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    by_key, section = {}, ""
    for text in lines:
        if text.startswith("["):
            section = text.strip("[]")
        elif " = " in text:
            by_key[f"{section}.{text.split(' = ')[0]}"] = text
    assert by_key["safety.max_out_nodes"].endswith(f"  # {site}")
    assert by_key["slurm.timeout_s"].endswith("  # --set")
    assert by_key["agent.collector_timeout_s"].endswith("  # default")
    assert by_key["store.root"] == f'root = "{tmp_path / "store"}"  # $GUARDCTL_STORE'
    assert by_key["safety.max_out_fraction"].endswith("  # default")
    assert lines[0] == f"# read: {site}, --set, $GUARDCTL_STORE"


scalars = st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_every_value_is_written_as_toml_reads_it(value: object) -> None:
    assert tomllib.loads(f"v = {toml_value(value)}")["v"] == value


def test_a_slurm_conf_typo_is_a_config_error_at_once(tmp_path: Path) -> None:
    typo = tmp_path / "slurm.cnof"
    started = time.monotonic()
    proc = guardctl(
        "--set",
        f"slurm.conf={typo}",
        "status",
        env=clean_env(GUARDCTL_STORE=str(tmp_path / "store")),
    )
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("guardctl: error:")
    assert str(typo) in proc.stderr and "no such file" in proc.stderr
    assert time.monotonic() - started < 15  # not a Slurm command's timeout


def test_the_pyslurm_backend_says_it_is_experimental(tmp_path: Path) -> None:
    proc = guardctl(
        "--set",
        "slurm.backend=pyslurm",
        "status",
        env=clean_env(GUARDCTL_STORE=str(tmp_path / "store")),
    )
    first = proc.stderr.splitlines()[0]
    assert first.startswith("guardctl: warning:") and "experimental" in first


def test_man_shows_the_packaged_pages() -> None:
    env = clean_env(MANWIDTH="80")
    for page, title in (("guardctl", "GUARDCTL(1)"), ("guardctl.toml", "GUARDCTL.TOML(5)")):
        path = guardctl("man", page, "--path", env=env)
        assert path.returncode == 0, path.stderr
        assert Path(path.stdout.strip()).is_file()
        shown = guardctl("man", page, env=env)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.lstrip().startswith(title)
