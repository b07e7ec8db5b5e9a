"""Settings a production config could carry by mistake: non-finite numbers, a bad hostlist, a
lease shorter than a pass. Each is a configuration error at load (exit 3, one line naming the
key), never a daemon that runs with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guardctl.config import load_settings
from guardctl.controller.loop import Controller
from guardctl.errors import ConfigError
from guardctl.slurm.memory import MemorySlurm


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def _guardctl(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUARDCTL")}
    env["GUARDCTL_STORE"] = str(store)
    return subprocess.run(
        [sys.executable, "-m", "guardctl", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[control]\nlease_s = nan\n", "control.lease_s"),
        ("[control]\ninterval_s = inf\n", "control.interval_s"),
        ("[control]\nrelapse_window_s = nan\n", "control.relapse_window_s"),
        ("[control]\nflap_window_s = -inf\n", "control.flap_window_s"),
        ("[slurm]\ntimeout_s = nan\n", "slurm.timeout_s"),
        ("[analyze.detectors.thermal]\nmax_temp_c = inf\n", "analyze.detectors.thermal.max_temp_c"),
    ],
)
def test_a_number_that_is_not_finite_is_a_config_error(tmp_path: Path, text: str, key: str) -> None:
    bad = _config(tmp_path, text)
    with pytest.raises(ConfigError, match="finite") as info:
        load_settings([bad], environ={})
    assert key in str(info.value) and str(bad) in str(info.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[control.racks]\nr1 = "node[1-"\n', "racks.r1"),
        ('[control.models]\nH100 = "node[4-2]"\n', "models.H100"),
        ('[control.racks]\nr2 = "node1,@admins"\n', "racks.r2"),
    ],
)
def test_a_bad_hostlist_is_a_config_error_at_load(tmp_path: Path, text: str, key: str) -> None:
    bad = _config(tmp_path, text)
    with pytest.raises(ConfigError, match="invalid node list") as info:
        load_settings([bad], environ={})
    assert key in str(info.value)


def test_good_hostlists_load(tmp_path: Path) -> None:
    good = _config(
        tmp_path,
        '[control.racks]\nr1 = "node[1-16]"\n[control.models]\n'
        'A100 = "node[1-8]"\nH100 = "node[9-16]"\n',
    )
    settings = load_settings([good], environ={})
    assert settings.control.racks == {"r1": "node[1-16]"}


def test_a_lease_shorter_than_three_pass_intervals_is_refused(tmp_path: Path) -> None:
    # Each layer alone may be fine: the bound is checked on what they make together.
    one = _config(tmp_path, "[control]\nlease_s = 600.0\n")
    two = tmp_path / "interval.toml"
    two.write_text("[control]\ninterval_s = 300.0\n")
    with pytest.raises(ConfigError, match=r"control\.lease_s = 600: must be at least 3 x"):
        load_settings([one, two], environ={})
    assert (
        load_settings([one], assignments=["control.interval_s=200"], environ={}).control.interval_s
        == 200.0
    )


def test_an_interval_on_the_command_line_the_lease_does_not_outlast_is_refused(
    tmp_path: Path,
) -> None:
    settings = load_settings(environ={"GUARDCTL_STORE": str(tmp_path)})  # lease_s 180
    c = Controller(settings, act=True, slurm=MemorySlurm(["node1"], start=time.time()))
    with pytest.raises(ConfigError, match="--interval = 120"):
        c.as_daemon(120.0)
    assert c.polled is False  # no daemon was made of it
    c.as_daemon(60.0)
    assert c.polled is True


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[control]\nlease_s = nan\n", "control.lease_s"),
        ('[control.racks]\nr1 = "node[1-"\n', "control: racks.r1"),
        ("[control]\nlease_s = 60.0\n", "control.lease_s = 60"),
    ],
)
def test_the_cli_says_so_in_one_line_and_exits_3(tmp_path: Path, text: str, key: str) -> None:
    bad = _config(tmp_path, text)
    proc = _guardctl(tmp_path / "store", "--config", str(bad), "config")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("guardctl: error: ") and key in lines[0]
    assert "Traceback" not in proc.stderr
