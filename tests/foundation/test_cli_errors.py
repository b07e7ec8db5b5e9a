"""One-line errors and documented exit codes, without a Slurm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from guardctl.errors import ExitCode


def guardctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "guardctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.stderr.startswith("guardctl: error:") and proc.stderr.count("\n") == 1


def test_config_error_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "g.toml"
    bad.write_text("[safety]\nmax_out_nodes = -1\n")
    proc = guardctl("--config", str(bad), "config")
    assert proc.returncode == ExitCode.CONFIG and one_line_error(proc)
    assert str(bad) in proc.stderr and "max_out_nodes" in proc.stderr


def test_slurm_missing_is_a_slurm_error(tmp_path: Path) -> None:
    proc = guardctl(
        "--set", f"slurm.bin_dir={tmp_path}", "--set", f"store.root={tmp_path}", "status"
    )
    assert proc.returncode == ExitCode.SLURM and one_line_error(proc)
    assert "sinfo not found" in proc.stderr


def test_usage_error_exit_code() -> None:
    proc = guardctl("drain", "node1;reboot", "--reason", "x")
    assert proc.returncode == ExitCode.USAGE and one_line_error(proc)


def test_config_json_round_trip(tmp_path: Path) -> None:
    proc = guardctl("--set", "safety.max_out_nodes=3", "config", "--json")
    assert proc.returncode == 0
    assert '"max_out_nodes": 3' in proc.stdout


def test_store_not_writable_is_io_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the store directory should be
    proc = guardctl("--set", f"store.root={blocker}/store", "history")
    assert proc.returncode in (ExitCode.OK, ExitCode.IO)
    proc = guardctl(
        "--set",
        f"store.root={blocker}/store",
        "--set",
        f"slurm.bin_dir={tmp_path}",
        "drain",
        "node1",
        "--reason",
        "x",
    )
    assert proc.returncode in (ExitCode.IO, ExitCode.SLURM) and one_line_error(proc)
