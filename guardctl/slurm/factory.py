"""Build the configured Slurm backend."""

from __future__ import annotations

from typing import Any

from guardctl.errors import ConfigError
from guardctl.slurm.types import SlurmClient


def make_client(settings: Any) -> SlurmClient:
    """The backend named by ``slurm.backend`` (``cli`` by default)."""
    slurm_settings = settings.slurm
    if slurm_settings.backend == "pyslurm":
        from guardctl.slurm.pyslurm_backend import PyslurmClient

        return PyslurmClient(slurm_settings)
    if slurm_settings.backend == "cli":
        from guardctl.slurm.cli_backend import CliSlurm

        return CliSlurm(slurm_settings)
    raise ConfigError(f"slurm.backend: unknown backend {slurm_settings.backend!r}")
