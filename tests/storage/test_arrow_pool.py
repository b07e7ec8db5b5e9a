"""guardctl loads pyarrow with jemalloc as its memory pool (Arrow's C++ readers take the pool
chosen at load), unless a pool was chosen, and leaves no variable behind for its children."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SHOW = (
    "import os, guardctl.storage.closed as c;"
    "print(c.pa.default_memory_pool().backend_name, os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))"
)


def _run(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _has_jemalloc() -> bool:
    out = subprocess.run(
        [sys.executable, "-c", "import pyarrow as pa; pa.jemalloc_memory_pool()"],
        capture_output=True,
    )
    return out.returncode == 0


@pytest.mark.skipif(sys.platform != "linux", reason="jemalloc is asked for on Linux")
def test_jemalloc_unless_a_pool_was_chosen() -> None:
    if not _has_jemalloc():
        pytest.skip("this pyarrow was built without jemalloc")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    assert _run(env) == "jemalloc None"
    assert _run({**env, "ARROW_DEFAULT_MEMORY_POOL": "system"}) == "system system"
