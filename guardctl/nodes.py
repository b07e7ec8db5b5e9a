"""Node names and node sets in Slurm's hostlist syntax (``node[1-4,7]``).

Names are validated *before* anything reaches Slurm: a name is what Slurm
itself accepts for NodeName (letters, digits, '-', '_', '.'), never starting
with '-' (it would read as an option), at most 64 characters. ClusterShell
does the range arithmetic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from guardctl.errors import UsageError

NODE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# What may appear in a hostlist expression at all; checked before parsing so
# that ClusterShell's own extensions (@groups, ! exclusion, ^files) never apply.
_EXPRESSION = re.compile(r"^[A-Za-z0-9_.,\[\]-]+$")
MAX_EXPANDED = 100_000


def validate_name(name: str) -> str:
    """Return *name* if it is a valid node name, else raise UsageError."""
    if not NODE_NAME.match(name):
        raise UsageError(f"invalid node name {name!r}")
    return name


def expand(expression: str) -> list[str]:
    """Expand a hostlist expression into validated node names, in order, without repeats."""
    text = expression.strip()
    if not text or not _EXPRESSION.match(text):
        raise UsageError(f"invalid node list {expression!r}")
    # Imported here: the probe (inside every training rank) validates names through this
    # module and must load nothing beyond the standard library.
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError, RangeSetParseError

    try:
        nodeset = NodeSet(text)
    except (NodeSetParseError, RangeSetParseError) as exc:
        raise UsageError(f"invalid node list {expression!r}: {exc}") from None
    if len(nodeset) > MAX_EXPANDED:
        raise UsageError(f"node list {expression!r} names more than {MAX_EXPANDED} nodes")
    return [validate_name(n) for n in nodeset]


def expand_all(expressions: Iterable[str]) -> list[str]:
    """Expand several expressions (as given on a command line) into one ordered list."""
    seen: dict[str, None] = {}
    for expr in expressions:
        for name in expand(expr):
            seen.setdefault(name, None)
    return list(seen)


def fold(names: Iterable[str]) -> str:
    """Fold names back into the shortest hostlist expression (``node[1-3]``)."""
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist([validate_name(n) for n in names]))
