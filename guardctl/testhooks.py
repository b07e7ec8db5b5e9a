"""Test hooks (fault injection), and the one check that keeps them off real clusters.

guardctl has two hooks for its tests and the demo: ``sweep.inject`` / ``GUARDCTL_SWEEP_INJECT``
(the sweep programs on a node really run slower, so its sweep fails) and ``GUARDCTL_TEST_CRASH``
(guardctl exits between two steps of a node action, as a crash would). On a production cluster
either would drain a healthy node or leave an action half done, so every hook asks
:func:`require_lab` first: a hook is honoured only when the slurm.conf in use is a local lab's,
recognised by the marker line ``slurm/lab/up.sh`` writes at its top. Anywhere else the command
stops with a one-line error (exit 6) before it does anything.

It imports nothing but the standard library and :mod:`guardctl.errors`: the sweep programs in
``sweeps/`` run on compute nodes and use this module when guardctl is installed there, and refuse
the hook when it is not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from guardctl.errors import RefusedError

LAB_MARKER = "# guardctl-lab:"  # the first line of every slurm.conf slurm/lab/up.sh writes
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
INJECT_ENV = "GUARDCTL_SWEEP_INJECT"
CRASH_ENV = "GUARDCTL_TEST_CRASH"


class NotALab(RefusedError):
    """A test hook was asked for on a cluster that is not a local lab."""


def slurm_conf(configured: str = "", environ: Mapping[str, str] | None = None) -> Path:
    """The slurm.conf Slurm's commands use: ``[slurm] conf``, else SLURM_CONF, else the default."""
    env = os.environ if environ is None else environ
    return Path(configured or env.get("SLURM_CONF") or DEFAULT_SLURM_CONF)


def is_lab(conf: Path) -> bool:
    """Whether *conf* was written by slurm/lab/up.sh (its first line is the lab's marker)."""
    try:
        with conf.open(encoding="utf-8", errors="replace") as handle:
            return handle.readline().startswith(LAB_MARKER)
    except OSError:
        return False


def require_lab(hook: str, configured: str = "", environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`NotALab` unless the slurm.conf in use is a local lab's."""
    conf = slurm_conf(configured, environ)
    if not is_lab(conf):
        raise NotALab(
            f"{hook} is a test hook, honoured only on a local lab cluster (slurm/lab/up.sh); "
            f"{conf} does not start with the '{LAB_MARKER}' marker line; nothing was done"
        )


def crash_point(name: str, environ: Mapping[str, str] | None = None) -> None:
    """Exit at once (as a crash would) when ``GUARDCTL_TEST_CRASH`` names this point.

    Callers check :func:`require_lab` for ``GUARDCTL_TEST_CRASH`` before their first change.
    """
    env = os.environ if environ is None else environ
    if env.get(CRASH_ENV) == name:
        os._exit(99)
