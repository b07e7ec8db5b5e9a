"""Telemetry collectors: one plugin per file, registered by name into a small registry.

A collector turns one look at the node into schema-v1 records. Adding one means
adding one file here that defines a class and calls :func:`register` at its
bottom; this module imports every file of the package. Collectors gather data
only: judging it is the analyzer's job.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Protocol

from guardctl.errors import ConfigError
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
_REGISTRY: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Make a collector available under *name* (called at the bottom of its file)."""
    if name in _REGISTRY:
        raise RuntimeError(f"collector {name!r} registered twice")
    _REGISTRY[name] = factory


def names() -> list[str]:
    """The registered collectors' names, sorted."""
    return sorted(_REGISTRY)


def create(name: str, settings: AgentSettings) -> Collector:
    """Build the collector called *name*; an unknown name is a configuration error."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"agent.collectors: unknown collector {name!r} (known: {', '.join(names())})"
        ) from None
    return factory(settings)


for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
