"""Typed errors and the documented exit codes that the CLI maps them to.

Every failure guardctl can foresee is one of these classes; the CLI's single
handler prints ``guardctl: error: <message>`` on one line and exits with the
class's code. A *finding* (a suspect or unhealthy node) is not an error: it has
its own exit code so that cron jobs and scripts can branch on it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of every guardctl command (documented in guardctl(1))."""

    OK = 0
    FINDINGS = 1  # ran fine and found something to act on (suspect / unhealthy node)
    USAGE = 2  # bad command line: unknown option, bad node name, unknown node
    CONFIG = 3  # a configuration file or value is invalid
    SLURM = 4  # a Slurm command ran and failed
    SLURM_UNAVAILABLE = 5  # Slurm timed out or its controller is down
    REFUSED = 6  # refused by a safety rule (ownership, cap, rate limit)
    INPUT = 7  # unreadable or invalid input data (telemetry file, trace)
    IO = 8  # the store or another local path cannot be written
    INTERNAL = 70  # a bug: please report it (EX_SOFTWARE)


class GuardctlError(Exception):
    """Base of all foreseen errors; carries the exit code."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UsageError(GuardctlError):
    """The command line is wrong (bad node name, unknown node, bad value)."""

    exit_code = ExitCode.USAGE


class ConfigError(GuardctlError):
    """A configuration layer is invalid; the message names the file and the key."""

    exit_code = ExitCode.CONFIG


class SlurmError(GuardctlError):
    """A Slurm command ran and returned an error."""

    exit_code = ExitCode.SLURM


class SlurmUnavailable(SlurmError):
    """Slurm did not answer in time, or its controller is down."""

    exit_code = ExitCode.SLURM_UNAVAILABLE


class RefusedError(GuardctlError):
    """A safety rule refused the action; nothing was changed."""

    exit_code = ExitCode.REFUSED


class InputError(GuardctlError):
    """Input data cannot be read or is invalid as a whole."""

    exit_code = ExitCode.INPUT


class SourceError(InputError):
    """The telemetry source did not give a complete answer (exit code 7, bad input)."""


class StoreError(GuardctlError):
    """A local path (the shared store, an output file) cannot be written or read."""

    exit_code = ExitCode.IO
