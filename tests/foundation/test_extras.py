"""Compute nodes install only what they run: the agent and the hooks need no extra, and a
command whose extra is missing says which one in one line (exit 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from guardctl.errors import ExitCode
from guardctl.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
WITHOUT = Path(__file__).with_name("without.py")
# Every extra's packages, by the name they are imported as.
SERVICE_ONLY = ("matplotlib", "prometheus_client", "httptools", "orjson")


def run_without(
    blocked: tuple[str, ...],
    *args: str,
    tmp_path: Path,
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    loaded = tmp_path / "loaded.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GUARDCTL"))}
    env.update(GUARDCTL_STORE=str(tmp_path / "store"), GUARDCTL_TEST_LOADED=str(loaded))
    proc = subprocess.run(
        [sys.executable, str(WITHOUT), ",".join(blocked), "-m", "guardctl", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, set(loaded.read_text().split()) if loaded.exists() else set()


@pytest.mark.parametrize(
    "command",
    [
        ["agent", "--help"],
        ["hook", "--help"],
        ["--help"],
        ["hook", "healthcheck", "--help"],
        ["config"],
    ],
)
def test_the_agent_and_hooks_run_without_any_extra(tmp_path: Path, command: list[str]) -> None:
    proc, loaded = run_without(SERVICE_ONLY, *command, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert loaded and not loaded & {*SERVICE_ONLY, "aiohttp", "torch"}


@pytest.mark.parametrize(
    ("extra", "command"),
    [
        ("report", ["report", "--format", "html"]),
        ("export", ["export", "--prometheus", "out.prom"]),
        ("dds", ["dds", "serve", "--job", "7", "--records", "10"]),
        ("report", ["simulate", "cluster", "--report", "plots"]),
    ],
)
def test_a_missing_extra_is_named_in_one_line(
    tmp_path: Path, extra: str, command: list[str]
) -> None:
    proc, _ = run_without(EXTRAS[extra], *command, tmp_path=tmp_path)
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("guardctl: error:")
    assert f"pip install 'guardctl[{extra}]'" in proc.stderr
    assert not (tmp_path / "store").exists()  # stopped before its work


def test_pyproject_keeps_the_extras_out_of_the_core() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {dep.split(">")[0].split("=")[0].lower() for dep in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    for name in EXTRAS:
        packages = {dep.split(">")[0].lower() for dep in extras[name]}
        assert not packages & core, name
    assert not {"matplotlib", "prometheus-client", "httptools", "orjson"} & core
    assert any(
        dep.startswith("guardctl[") and all(e in dep for e in EXTRAS) for dep in extras["dev"]
    )  # CI installs every part
