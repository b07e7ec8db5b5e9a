"""Run Python as if some packages were not installed: ``without.py MOD[,MOD] -m MODULE ARGS``.

A finder placed first on ``sys.meta_path`` answers every import of the named top-level
modules with the ImportError of a module that is not installed. With ``GUARDCTL_TEST_LOADED``
set to a path, the top-level modules loaded by the end are written there, one a line.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


class Without:
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def write_loaded(path: str) -> None:
    Path(path).write_text("\n".join(sorted({m.split(".")[0] for m in sys.modules})) + "\n")


def main() -> None:
    names, how, what, *args = sys.argv[1:]
    blocked = {n for n in names.split(",") if n}
    for loaded in [m for m in sys.modules if m.split(".")[0] in blocked]:
        del sys.modules[loaded]
    sys.meta_path.insert(0, Without(blocked))
    sys.path.insert(0, str(REPO))  # as ``python -m`` in the repository would
    if os.environ.get("GUARDCTL_TEST_LOADED"):
        atexit.register(write_loaded, os.environ["GUARDCTL_TEST_LOADED"])
    assert how == "-m"
    sys.argv = [what, *args]
    runpy.run_module(what, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
