"""Where the files guardctl ships beside its code are: man pages and the Slurm hook scripts.

pyproject.toml installs them as data files under ``<prefix>/share`` (a venv's own prefix, or
``/usr`` for a system package); a source checkout (an editable install, which installs no
data files) has them in the repository. The first place that has the file wins.
"""

from __future__ import annotations

import sys
from pathlib import Path

import guardctl

CHECKOUT = Path(guardctl.__file__).resolve().parent.parent
PREFIXES = (Path(sys.prefix), Path("/usr/local"), Path("/usr"))
# Each kind of data file: its folder in the repository, and under <prefix>/ once installed.
KINDS = {
    "man1": ("man", "share/man/man1"),
    "man5": ("man", "share/man/man5"),
    "slurm": ("slurm", "share/guardctl/slurm"),
}


def candidates(kind: str) -> list[Path]:
    """The folders searched for *kind*, in order."""
    in_checkout, installed = KINDS[kind]
    return [CHECKOUT / in_checkout, *(prefix / installed for prefix in PREFIXES)]


def find(kind: str, name: str) -> Path | None:
    """The data file *name* of *kind*, or None where it is in none of the places."""
    for folder in candidates(kind):
        if (folder / name).is_file():
            return folder / name
    return None
