"""One plugin registry for every kind of plugin guardctl has (collectors, detectors, checks, ...).

Each plugin lives in a file of its own and registers itself at the bottom of that file, as
node_exporter's collectors do. A registry imports its package's modules the first time it is
asked for a plugin, so a plugin is found without a list of them anywhere. Registering a name twice
is a programming error and fails at import, never a silent overwrite; asking for an unknown name
raises the error type the caller's input deserves (a config error for a setting, a usage error
for a command-line argument), naming the known ones.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from guardctl.errors import GuardctlError, UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    """Plugins of one kind, by name."""

    def __init__(
        self, kind: str, package: str | None = None, unknown: type[GuardctlError] = UsageError
    ) -> None:
        self.kind = kind
        self.package = package
        self.unknown = unknown
        self._items: dict[str, T] = {}
        self._loaded = False

    def add(self, name: str, item: T) -> T:
        """Register *item* under *name*; returns it, so that it can be used as a decorator."""
        if name in self._items:
            raise RuntimeError(f"{self.kind} {name!r} registered twice")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers what it decorates."""
        return lambda item: self.add(name, item)

    def load(self) -> None:
        """Import every module of the package once (each registers its plugins).

        A registry without a package holds plugins that all live in one module.
        """
        if self._loaded or self.package is None:
            return
        self._loaded = True
        package = importlib.import_module(self.package)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")

    def get(self, name: str, where: str = "") -> T:
        """The plugin called *name*; an unknown name raises ``unknown`` naming the known ones."""
        self.load()
        try:
            return self._items[name]
        except KeyError:
            prefix = f"{where}: " if where else ""
            raise self.unknown(
                f"{prefix}unknown {self.kind} {name!r} (known: {', '.join(self.names())})"
            ) from None

    def names(self) -> list[str]:
        """The names in the order they were registered (module name order for a package)."""
        self.load()
        return list(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, plugin) in the order they were registered."""
        self.load()
        return iter(list(self._items.items()))

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._items
