"""Run Python as if orjson were not installed: ``no_orjson.py -m MODULE ARGS`` or ``-c CODE``.

A finder placed first on ``sys.meta_path`` refuses the module, as a missing
installation would (``ImportError``), for this process and what it imports.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


class NoOrjson:
    """Answers every import of orjson with the ImportError of a module not installed."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "orjson" or name.startswith("orjson."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> None:
    sys.modules.pop("orjson", None)
    sys.meta_path.insert(0, NoOrjson())
    sys.path.insert(0, str(REPO))  # as ``python -m`` in the repository would
    how, what, *args = sys.argv[1:]
    sys.argv = [what, *args]
    if how == "-m":
        runpy.run_module(what, run_name="__main__", alter_sys=True)
    else:
        sys.argv[0] = "-c"
        exec(compile(what, "<no_orjson -c>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main()
