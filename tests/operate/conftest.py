"""The operator's guide (docs/operate/) walked through on the lab, as a new administrator
would. The controller's and the analyzer's test helpers are importable from here."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for sub in ("controller", "analyze", "sweep"):
    path = str(HERE.parent / sub)
    if path not in sys.path:
        sys.path.insert(0, path)
