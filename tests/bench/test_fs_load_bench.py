"""The filesystem-load benchmark's reading of strace: the calls on the store's files, and the
time spent in their appends and fsyncs (what a network filesystem adds and the page cache hides).

The whole benchmark (nine traced processes for a minute) is not run here; its counting is, on a
real traced writer and on the lines strace writes when threads interleave.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from benchtools import bench_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "fs_load.py"

WRITER = """
import os, sys
store = sys.argv[1]
os.makedirs(os.path.join(store, "telemetry"), exist_ok=True)
fd = os.open(os.path.join(store, "telemetry", "n.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
for _ in range(3):
    os.write(fd, b'{"kind": "host"}\\n')
    os.fsync(fd)
os.close(fd)
with open(os.path.join(sys.argv[2], "elsewhere"), "w") as other:  # not the store's
    other.write("x")
"""


def _module() -> Any:
    return bench_module("fs_load")


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_traced_writers_appends_and_fsyncs_are_counted_and_timed(tmp_path: Path) -> None:
    bench = _module()
    store, local = tmp_path / "store", tmp_path / "local"
    store.mkdir()
    local.mkdir()
    argv = [sys.executable, "-c", WRITER, str(store), str(local)]
    proc = bench._traced(local / "strace.writer", argv, {"PATH": "/usr/bin:/bin"})
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    counts, times = bench._count(local, str(store), (0.0, float("inf")))
    assert counts["append"] == 3
    assert counts["fsync"] == 3
    assert counts["open"] >= 1
    assert times["append"] > 0
    assert times["fsync"] >= times["fsync_max"] > 0


def test_a_call_interrupted_by_another_thread_keeps_its_time(tmp_path: Path) -> None:
    bench = _module()
    store = "/shared/store"
    lines = [
        f'7 100.0 write(3<{store}/telemetry/n.jsonl>, "{{}}\\n", 3 <unfinished ...>',
        f"8 100.1 fsync(4<{store}/steps/j/n.r0.jsonl>) = 0 <0.250000>",
        "7 100.2 <... write resumed>) = 3 <0.125000>",
        '8 100.3 write(1</dev/pts/0>, "x", 1) = 1 <0.500000>',  # not the store's
        f"9 100.4 fsync(5<{store}/telemetry/n.jsonl> <unfinished ...>",
        "9 100.5 <... fsync resumed>) = 0 <0.375000>",
        f"9 500.0 fsync(5<{store}/telemetry/n.jsonl>) = 0 <9.000000>",  # after the window
    ]
    (tmp_path / "strace.rank0").write_text("\n".join(lines) + "\n")
    counts, times = bench._count(tmp_path, store, (100.0, 200.0))
    assert counts == {"append": 1, "fsync": 2}
    assert times == {"append": 0.125, "fsync": 0.625, "fsync_max": 0.375}


def test_the_stores_filesystem_is_named_by_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    bench = _module()
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    root_type = next(kind for _, mount, kind, *_ in mounts if mount == "/")
    assert bench.filesystem_type(Path("/")) == root_type
    assert bench.filesystem_type(Path("/proc/self")) == "proc"
