"""Fixtures for the foundation tests: run guardctl as a real process against the lab."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from guardctl.storage import store as shared_store


@dataclass
class Guardctl:
    """Runs ``python -m guardctl`` with a private store and config, like an operator would."""

    env: dict[str, str]
    store: Path
    config: Path

    def __call__(
        self, *args: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "guardctl", "--config", str(self.config), *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def json(self, *args: str) -> Any:
        proc = self(*args, "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def status(self) -> dict[str, dict[str, Any]]:
        return {n["node"]: n for n in self.json("status")["nodes"]}


def write_config(
    path: Path, store: Path, conf: str = "", extra: str = "", bin_dir: str = ""
) -> Path:
    path.write_text(
        f'[store]\nroot = "{store}"\n'
        + (f'[slurm]\nconf = "{conf}"\ntimeout_s = 10.0\n' if conf else "")
        + (f'bin_dir = "{bin_dir}"\n' if conf and bin_dir else "")
        + "[safety]\nmax_out_fraction = 0.5\nmax_out_nodes = 2\n"
        + extra
    )
    return path


@pytest.fixture
def gctl_factory(tmp_path: Path) -> Callable[..., Guardctl]:
    def make(
        conf: str = "", extra: str = "", env: dict[str, str] | None = None, bin_dir: str = ""
    ) -> Guardctl:
        store = tmp_path / "store"
        shared_store.init(store)  # what the administrator does once, at install time
        config = write_config(tmp_path / "guardctl.toml", store, conf, extra, bin_dir)
        base = {
            k: v
            for k, v in (env or os.environ).items()
            if k not in ("GUARDCTL_STORE", "GUARDCTL_CONFIG")
        }
        return Guardctl(base, store, config)

    return make


@pytest.fixture
def gctl(lab: Any, gctl_factory: Callable[..., Guardctl]) -> Guardctl:
    """guardctl pointed at the clean lab cluster, with a cap of 2 nodes."""
    return gctl_factory(conf=str(lab.conf), env=lab.env, bin_dir=str(lab.bin_dir or ""))
