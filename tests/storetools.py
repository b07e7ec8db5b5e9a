"""What tests read of a node agent's files in the store (telemetry/<segment>/<node>.jsonl)."""

from __future__ import annotations

import math
from pathlib import Path

from guardctl.storage import layout
from guardctl.telemetry.schema import ReadResult, iter_file


def agent_files(root: Path, node: str) -> list[Path]:
    """Every JSON Lines file *node*'s agent wrote under store *root*, oldest segment first."""
    return layout.node_files(root, node, -math.inf, math.inf)


def agent_records(root: Path, node: str) -> ReadResult:
    """The records of :func:`agent_files`, in order, bad lines counted."""
    result = ReadResult()
    for path in agent_files(root, node):
        result.files += 1
        result.records.extend(iter_file(path, result.bad))
    result.lines = len(result.records) + result.bad_total
    return result
