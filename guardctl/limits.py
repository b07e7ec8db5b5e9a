"""The process limits guardctl's long-running services lift for themselves.

A service holding many files open (the data-sharding service's connections, the controller's
analyzer keeping every node's column mirror open between passes) would otherwise run into
the common default of 1024 open files: where the hard limit allows more, the soft limit is
raised toward it, never past it (an administrator's hard limit stands).
"""

from __future__ import annotations

import resource

# The open-files limit the controller's daemon raises itself to (within the hard limit): its
# unit's LimitNOFILE (contrib/guardctl-control.service). Its analyzer keeps mirrors open
# within a quarter of it: at 100k GPUs some 25,000 while a segment turns.
CONTROLLER_OPEN_FILES = 524288


def raise_open_files_limit(want: int) -> int:
    """Lift the soft limit on open files toward *want* (at most the hard limit); the soft
    limit now. A limit the kernel refuses (past ``fs.nr_open`` under an unlimited hard
    limit) leaves it as it was: the service runs, opening files more often."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft
        return target
    return soft
