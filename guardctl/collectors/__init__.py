"""Telemetry collectors: one plugin per file, registered by name into a small registry.

A collector turns one look at the node into schema-v1 records. Adding one means
adding one file here that defines a class and calls :func:`register` at its
bottom; this module imports every file of the package. Collectors gather data
only: judging it is the analyzer's job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from guardctl.errors import ConfigError
from guardctl.plugins import Registry
from guardctl.sections.agent import AgentSettings

Record = dict[str, Any]


class CollectorUnavailable(Exception):
    """This collector cannot run on this node (no driver, no such hardware)."""


class Collector(Protocol):
    """What the agent calls once per sample, in a thread of its own, under a timeout."""

    name: str

    def collect(self, node: str, ts: float) -> list[Record]:
        """Return this sample's records; raise CollectorUnavailable if it cannot run here."""
        ...

    def close(self) -> None:
        """Release what collect() opened (handles, event sets)."""
        ...


Factory = Callable[[AgentSettings], Collector]
COLLECTORS: Registry[Factory] = Registry("collector", __name__, unknown=ConfigError)


def register(name: str, factory: Factory) -> None:
    """Make a collector available under *name* (called at the bottom of its file)."""
    COLLECTORS.add(name, factory)


def names() -> list[str]:
    """The registered collectors' names, sorted."""
    return sorted(COLLECTORS.names())


def create(name: str, settings: AgentSettings) -> Collector:
    """Build the collector called *name*; an unknown name is a configuration error."""
    return COLLECTORS.get(name, "agent.collectors")(settings)
