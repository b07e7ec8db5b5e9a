"""Step records in the agent's node file give the analysis that per-rank step files give.

A simulated fleet's store (per-rank step files, as probes without an agent write them) is laid
out again as agents that take their ranks' steps write it: one file per node and hour holding
every kind, appended every 10 s, each append the node's samples then the steps that arrived.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from guardctl.analyze import analyze
from guardctl.analyze.incremental import Analyzer
from guardctl.config import load_settings
from guardctl.simulate import simulate
from guardctl.telemetry import mirror

START = 1_764_547_200.0 - 600  # the replay crosses into a new hour's files
CADENCE_S = 10.0


def _batches(src: Path) -> dict[Path, list[tuple[float, bytes]]]:
    """Each node file's appends: (when, bytes), the samples first, then the ranks' steps."""
    appends: dict[Path, dict[float, list[list[bytes]]]] = defaultdict(dict)
    for path in sorted(src.rglob("*.jsonl")):
        rel = path.relative_to(src)
        is_steps = rel.parts[0] == "steps"
        for line in path.read_bytes().splitlines(keepends=True):
            rec = json.loads(line)
            if is_steps:
                hour = path.name.rsplit(".", 2)[1]
                rel = Path("telemetry") / rec["node"] / f"{hour}.jsonl"
            at = (rec["ts"] // CADENCE_S + 1) * CADENCE_S  # written at the next cadence
            parts = appends[rel].setdefault(at, [[], []])
            parts[is_steps].append(line)
    return {
        rel: [(at, b"".join(own + ranks)) for at, (own, ranks) in sorted(by_time.items())]
        for rel, by_time in appends.items()
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("per-rank")
    simulate(src, nodes=16, duration=1500.0, seed=3, faults="all", start=START)
    return src


def test_cold_and_incremental_passes_over_node_files_equal_per_rank_files(
    fleet: Path, tmp_path: Path
) -> None:
    settings = load_settings(environ={})
    store = tmp_path / "agent-written"
    appends = _batches(fleet)
    assert not any(rel.parts[0] == "steps" for rel in appends)
    cols = mirror.Mirror()
    analyzer = Analyzer(settings, store)
    passes = 0
    try:
        done = dict.fromkeys(appends, 0)
        for minute in range(1, 27):
            now = START + minute * 60.0
            for rel, batches in appends.items():
                while done[rel] < len(batches) and batches[done[rel]][0] <= now:
                    path = store / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with open(path, "ab") as fh:
                        start = fh.tell()
                        fh.write(batches[done[rel]][1])
                    cols.append(path, start, batches[done[rel]][1])
                    done[rel] += 1
            if minute % 5 == 0 or minute > 24:
                got = analyzer.analyze().to_dict()
                assert got == analyze(store, settings).to_dict(), minute
                passes += 1
    finally:
        cols.close()
    assert passes == 6 and all(done[rel] == len(b) for rel, b in appends.items())
    want = analyze(fleet, settings).to_dict()
    got = analyze(store, settings).to_dict()
    assert got["input"]["files"] < want["input"]["files"]  # one per node and hour
    got["input"].pop("files"), want["input"].pop("files")
    assert got == want
    assert got["summary"]["suspect"] > 0
