"""Slurm access: one typed client interface, a CLI backend (default) and an optional pyslurm one.

The rest of guardctl sees only the dataclasses and the :class:`SlurmClient`
protocol defined in :mod:`guardctl.slurm.types`; text and JSON formats stay
inside the backends.
"""

from guardctl.slurm.types import JobInfo, NodeInfo, ReservationInfo, SlurmClient, SubmitRequest

__all__ = ["JobInfo", "NodeInfo", "ReservationInfo", "SlurmClient", "SubmitRequest", "make_client"]


def make_client(settings: object) -> SlurmClient:
    """Build the configured backend from a :class:`guardctl.config.Settings`."""
    from guardctl.slurm.factory import make_client as _make

    return _make(settings)
