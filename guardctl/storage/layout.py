"""Where things live in the shared store: the one definition of its directory layout.

::

    <root>/telemetry/<segment>/<node>.jsonl       node agent records (gpu, host, nic, and its
                                                  ranks' steps); one writer: that node's agent
                                                  (earlier versions wrote
                                                  telemetry/<node>/<segment>.jsonl: still read)
    <root>/steps/<job>/<node>.r<rank>.<segment>.jsonl  probe step records; one writer: that rank
    <root>/segments/kind=<kind>/date=<YYYY-MM-DD>/hour=<HH>/<segment>.parquet
                                                     closed segments: every node's records of
                                                     one kind (guardctl.storage.closed)
    <root>/segments/_manifests/<segment>.json        what each closed segment was made from
    <root>/actions/actions.jsonl                     guardctl's append-only action log
    <root>/sweeps/<sweep id>/                        sweep jobs' outputs and judged results
    <root>/baselines/                                learnt sweep baselines
    <root>/dds/<job>/                                the data-sharding service of one job
    <root>/cache/                                    derived, rebuildable data
    <root>/control/lease.json                        the controller's leader lease
    <root>/control/passes/<host>.json                each controller's last pass (its liveness)
    <root>/clocks/<role>.<name>.json                 each writer's clock heartbeat (guardctl.clock)

One file per time segment (UTC; an hour, ``20261130T14``, or ``[store] segment_minutes``,
``20261130T1410_10m``: :mod:`guardctl.storage.segments`) keeps each file small, makes retention
a matter of deleting whole files, and keeps one writer per file so that no locking is needed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from guardctl.nodes import validate_name
from guardctl.storage import segments
from guardctl.storage.segments import DEFAULT_MINUTES, segment_name


def _safe_component(text: str, what: str) -> str:
    # Job ids and sweep ids become directory names: keep them to a safe alphabet.
    if not text or not all(c.isalnum() or c in "._-" for c in text) or text.startswith("."):
        raise ValueError(f"invalid {what} {text!r}")
    return text


def telemetry_dir(root: Path) -> Path:
    return root / "telemetry"


def node_telemetry_file(root: Path, node: str, ts: float, minutes: int = DEFAULT_MINUTES) -> Path:
    """The node agent's file for the *minutes*-long segment holding *ts*: in the segment's
    directory, so that a reader lists only the segments it reads, and the controller lists
    again only the one being written, never a directory per node (12,500 at 100k GPUs,
    every one changing at each segment's start); and retention removes whole directories."""
    return telemetry_dir(root) / segment_name(ts, minutes) / f"{validate_name(node)}.jsonl"


def segment_directory(root: Path, directory: str) -> str | None:
    """The segment whose agents' files *directory* holds (``telemetry/<segment>/``); None for
    any other directory (a node's, of earlier versions, or a job's under ``steps/``)."""
    parent, name = os.path.split(directory)
    if parent != os.fspath(telemetry_dir(root)) or segments.span(name) is None:
        return None
    return name


def node_files(root: Path, node: str, since: float, until: float) -> list[Path]:
    """The node agent's JSON Lines files of *node* whose segment overlaps [since, until], in
    either layout: in each segment's directory, and in the node's own directory, where
    earlier versions wrote them. ValueError for a name that is not a node's."""
    name = validate_name(node)
    top = telemetry_dir(root)
    try:
        with os.scandir(top) as entries:
            subdirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:  # no agent wrote here yet
        return []
    found = []
    for sub in subdirs:
        if sub == name:
            found += _jsonl_in(top / sub)
        elif _overlaps(segments.span(sub), since, until):
            path = top / sub / f"{name}.jsonl"
            found += [path] if path.is_file() else []
    return sorted(p for p in found if _overlaps(segments.file_span(p), since, until))


def _overlaps(span: tuple[float, float] | None, since: float, until: float) -> bool:
    return span is not None and span[0] <= until and span[1] > since


def _jsonl_in(directory: Path) -> list[Path]:
    try:
        return [directory / n for n in os.listdir(directory) if n.endswith(".jsonl")]
    except OSError:
        return []


def steps_dir(root: Path) -> Path:
    return root / "steps"


def step_file(
    root: Path, job: str, node: str, rank: int, ts: float, minutes: int = DEFAULT_MINUTES
) -> Path:
    """A rank's own step file (no agent on its node) for the *minutes*-long segment of *ts*."""
    job_dir = steps_dir(root) / _safe_component(job, "job id")
    return job_dir / f"{validate_name(node)}.r{int(rank)}.{segment_name(ts, minutes)}.jsonl"


def actions_log(root: Path) -> Path:
    return root / "actions" / "actions.jsonl"


def sweeps_dir(root: Path) -> Path:
    return root / "sweeps"


def sweep_dir(root: Path, sweep_id: str) -> Path:
    return sweeps_dir(root) / _safe_component(sweep_id, "sweep id")


def baselines_dir(root: Path) -> Path:
    return root / "baselines"


def dds_dir(root: Path, job: str) -> Path:
    return root / "dds" / _safe_component(job, "job id")


def cache_dir(root: Path) -> Path:
    return root / "cache"


def clocks_dir(root: Path) -> Path:
    return root / "clocks"


def control_passes_dir(root: Path) -> Path:
    return root / "control" / "passes"


def telemetry_inputs(root: Path) -> list[Path]:
    """The directories holding schema-v1 records (what ``analyze`` reads by default)."""
    return [telemetry_dir(root), steps_dir(root)]


def segments_dir(root: Path) -> Path:
    return root / "segments"


def manifests_dir(root: Path) -> Path:
    return segments_dir(root) / "_manifests"


def manifest_path(root: Path, segment: str) -> Path:
    return manifests_dir(root) / f"{segment}{_MANIFEST}"


_MANIFEST = ".json"  # what follows a segment's name in its manifest's


def closed_segments(root: Path) -> frozenset[str]:
    """The segments whose manifest exists (closed), from one listing of the manifests'
    directory: weeks of segments are thousands of names, and on a network filesystem a
    look at each one's manifest is a round trip each."""
    try:
        with os.scandir(manifests_dir(root)) as entries:
            return frozenset(
                entry.name[: -len(_MANIFEST)]
                for entry in entries
                if entry.name.endswith(_MANIFEST) and entry.is_file()
            )
    except OSError:  # none closed yet, or unreadable: each segment is then looked at
        return frozenset()


def partition(root: Path, kind: str, start: float) -> Path:
    """The hive-style directory of a kind's records of the segment starting at *start*."""
    day, hour = time.strftime("%Y-%m-%d %H", time.gmtime(start)).split()
    return segments_dir(root) / f"kind={kind}" / f"date={day}" / f"hour={hour}"


def parquet_path(root: Path, kind: str, segment: str, start: float) -> Path:
    return partition(root, kind, start) / f"{segment}.parquet"
