"""The fault-injection suite: each test puts guardctl in a fault a production cluster meets (a
paused leader, skewed clocks, an unreadable lease, a full store, a late or silent slurmctld,
sweep jobs that never measured, stale or future telemetry, a node Slurm does not know) and
asserts what Slurm looks like afterwards and what the action log says.

Most run over the in-memory Slurm (fast); those whose behaviour is Slurm's own use the lab.
The helpers of the controller's and the sweeps' tests are importable from here.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for sub in ("controller", "analyze", "sweep", "foundation"):
    path = str(HERE.parent / sub)
    if path not in sys.path:
        sys.path.insert(0, path)
