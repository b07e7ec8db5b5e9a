"""Helpers for the hook tests: a job's step records as its ranks would have written them."""

from __future__ import annotations

from pathlib import Path

from guardctl.storage import layout
from guardctl.telemetry import schema


def write_straggler_job(root: Path) -> None:
    """Job 42 on node1-node3, one rank each, five steps: node3 computes 1.4 s of each 1.5 s step,
    its peers 1.0 and 1.02 s."""
    for node, compute in (("node1", 1.0), ("node2", 1.02), ("node3", 1.4)):
        path = layout.step_file(root, "42", node, 0, 1e9)
        path.parent.mkdir(parents=True, exist_ok=True)
        records = (
            schema.make_record(
                "step",
                node,
                1e9 + s,
                job="42",
                rank=0,
                step=s,
                step_s=1.5,
                compute_s=compute,
                comm_s=1.5 - compute,
            )
            for s in range(5)
        )
        path.write_text("".join(schema.dumps(r) + "\n" for r in records))
