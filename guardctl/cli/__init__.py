"""The guardctl command line: a thin layer over the library.

Every command lives in its own module in this package and registers itself on
:data:`guardctl.cli.base.main` when imported; this file imports them all. The
single error handler in :func:`guardctl.cli.base.main` maps each
:class:`guardctl.errors.GuardctlError` to ``guardctl: error: ...`` and its exit code.
"""

from __future__ import annotations

import importlib
import pkgutil

from guardctl.cli.base import main

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name != "base" and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["main"]
