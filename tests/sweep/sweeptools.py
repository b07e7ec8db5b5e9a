"""Helpers for the sweep tests: guardctl run as a real process against the lab."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labtools import job_python

from guardctl.storage import store as shared_store

FAST_SWEEPS = """
[sweep]
poll_interval_s = 0.3
gemm_threads = 1
allreduce_max_bytes = 4194304
allreduce_iters = 8
tolerance = 0.5
# The lab's all-reduce runs over loopback on two shared cores: two runs ten seconds apart
# measured 1.6 and 0.58 GB/s. Its sweeps pass at 0.2 x reference, so that a healthy node's
# second sweep is not judged on that noise; injected slow nodes fail on their GEMM.
references = { nccl = { lower = -0.8 }, pairwise = { lower = -0.8 } }
"""


@dataclass
class Guardctl:
    """``python -m guardctl`` with a private store and config, as an operator runs it."""

    env: dict[str, str]
    store: Path
    config: Path

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "guardctl", "--config", str(self.config), *args]

    def __call__(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                self.cmd(*args),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=str(self.store.parent),
            )
        except subprocess.TimeoutExpired as exc:
            # A run that hangs says where: its progress, and what its sweep jobs wrote.
            raise AssertionError(
                f"guardctl {' '.join(args)}: still running after {timeout:g} s"
                f"\n{_text(exc.stderr)}{self.sweep_outputs()}"
            ) from None

    def sweep_outputs(self, tail: int = 1500) -> str:
        """The end of every file the sweep jobs wrote (their outputs, srun's errors)."""
        out = []
        for path in sorted((self.store / "sweeps").rglob("*")):
            if path.is_file() and path.stat().st_size < (1 << 20):
                text = path.read_text(errors="replace")
                out.append(f"--- {path.relative_to(self.store)}\n{text[-tail:]}")
        return "\n".join(out)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.cmd(*args),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(self.store.parent),
        )


def make_guardctl(tmp_path: Path, lab: Any, extra: str = "") -> Guardctl:
    store = tmp_path / "store"
    shared_store.init(store)  # what the administrator does once, at install time
    os.chmod(tmp_path, 0o755)
    config = tmp_path / "guardctl.toml"
    config.write_text(
        f'[store]\nroot = "{store}"\n[slurm]\n{lab.slurm_toml()}timeout_s = 20.0\n'
        "[safety]\nmax_out_fraction = 0.5\nmax_out_nodes = 2\n"
        + FAST_SWEEPS
        # The sweep jobs run the lab's Python (the Debian root's, on another release).
        + f'python = "{job_python()}"\n'
        + extra
    )
    env = {k: v for k, v in lab.env.items() if k not in ("GUARDCTL_STORE", "GUARDCTL_CONFIG")}
    return Guardctl(env, store, config)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""
