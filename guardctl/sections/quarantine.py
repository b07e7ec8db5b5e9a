"""[quarantine]: the maintenance reservations that hold suspects for sweeps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuarantineSettings:
    """Naming and users of guardctl's per-node maintenance reservations."""

    reservation_prefix: str = "guardctl_q_"
    users: tuple[str, ...] = ("root",)  # who may run (sweep) jobs in the reservation

    def __post_init__(self) -> None:
        if not self.users:
            raise ValueError("users: at least one user must be allowed to run sweeps")
        if not self.reservation_prefix.replace("_", "").isalnum():
            raise ValueError("reservation_prefix: letters, digits and '_' only")
