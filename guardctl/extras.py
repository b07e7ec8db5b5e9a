"""Optional parts of guardctl and the packages each needs (``pip install 'guardctl[EXTRA]'``).

Compute nodes run the agent and the hooks, which need the core dependencies only; the HTML
report and the fleet simulation's plots (``report``), the Prometheus export (``export``) and
the data-sharding service (``dds``) each need a package more. A command that needs an extra
that is not installed stops with one line naming it, before it starts its work.
"""

from __future__ import annotations

import importlib

from guardctl.errors import ConfigError

# Extra -> the modules it installs (the names to import); pyproject.toml lists the packages.
EXTRAS = {
    "report": ("matplotlib",),
    "export": ("prometheus_client",),
    "dds": ("httptools",),
}


def need(extra: str, command: str) -> None:
    """Raise a :class:`ConfigError` (exit 3) when *extra*'s packages cannot be imported."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(
                f"guardctl {command} needs {module}, which is not installed: "
                f"pip install 'guardctl[{extra}]'"
            ) from None
