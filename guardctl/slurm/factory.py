"""Build the configured Slurm backend.

Settings that would only fail later are checked here, once: a ``slurm.conf`` path that
does not exist is a configuration error at once, not a Slurm command that waits out its
timeout and then reads as a controller that is down. The pyslurm backend has never run
against a Slurm controller: choosing it says so on stderr.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from guardctl.errors import ConfigError
from guardctl.slurm.types import SlurmClient

log = logging.getLogger("guardctl.slurm")

EXPERIMENTAL = (
    'guardctl: warning: slurm.backend = "pyslurm" is experimental (never run '
    'against a Slurm controller); production sites use "cli"'
)


def check_conf(conf: str) -> None:
    """A set ``slurm.conf`` must be a readable file (exit 3 naming it otherwise)."""
    if conf and not Path(conf).is_file():
        raise ConfigError(
            f"slurm.conf = {conf!r}: no such file (set the path of slurm.conf, "
            "or leave it empty for Slurm's default)"
        )


def make_client(settings: Any) -> SlurmClient:
    """The backend named by ``slurm.backend`` (``cli`` by default)."""
    slurm_settings = settings.slurm
    check_conf(slurm_settings.conf)
    if slurm_settings.backend == "pyslurm":
        log.warning(EXPERIMENTAL)
        from guardctl.slurm.pyslurm_backend import PyslurmClient

        return PyslurmClient(slurm_settings)
    if slurm_settings.backend == "cli":
        from guardctl.slurm.cli_backend import CliSlurm

        return CliSlurm(slurm_settings)
    raise ConfigError(f"slurm.backend: unknown backend {slurm_settings.backend!r}")
