"""The controller's daemon keeps the memory a pass frees for the next pass (a real process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# In a process of its own (the policy is the whole process's): an array of HOLD MiB made
# and held, a 200 MiB one made, freed (given back as MODE says) and one of AGAIN MiB made;
# the resident size after the free, and the page faults of the last.
_PROBE = r"""
import json, re, resource, sys
import numpy as np
from guardctl.analyze.allocator import give_back_freed_memory, keep_freed_memory

mode, hold, again = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
took = keep_freed_memory() if mode != "plain" else None
def rss(): return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1))
held = np.ones(hold << 17)
a = np.ones(25 << 20)
made = rss()
del a
if mode == "give back":
    give_back_freed_memory()
elif mode == "give back some":
    give_back_freed_memory(keep=1.0)
freed = rss()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(again << 17)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"took": took, "made": made, "freed": freed, "faults": faults}))
"""


def _probe(mode: str, hold: int = 0, again: int = 200) -> dict[str, int | bool | None]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode, str(hold), str(again)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_freed_memory_is_kept_for_the_next_allocation() -> None:
    plain, kept = _probe("plain"), _probe("keep")
    if not kept["took"]:
        pytest.skip("not glibc's allocator: nothing to ask")
    # By default the freed block goes back to the kernel and comes back as fresh pages ...
    assert plain["freed"] < plain["made"] - 150 * 1024
    assert plain["faults"] >= 50  # 2 MiB pages (transparent huge pages) or 4 KiB ones
    # ... kept, it stays resident and the next block of its size is made on it.
    assert kept["freed"] > kept["made"] - 10 * 1024
    assert kept["faults"] < plain["faults"] // 10


def test_a_first_passs_freed_memory_is_given_back_when_asked() -> None:
    """After a pass far larger than the next (a first pass reads whole hours), what it freed
    goes back to the kernel although the policy keeps freed memory."""
    kept, given = _probe("keep"), _probe("give back")
    if not given["took"]:
        pytest.skip("not glibc's allocator: nothing to ask")
    assert kept["freed"] > kept["made"] - 10 * 1024
    assert given["freed"] < given["made"] - 150 * 1024


def test_a_first_passs_freed_memory_is_kept_as_much_as_is_in_use_when_asked() -> None:
    """Asked to keep as much freed memory as is in use (100 MiB held here), the top of the
    freed 200 MiB goes back and about 100 MiB stays: the next temporaries of that size are
    made on it without faulting pages in, as the passes after a first pass do."""
    some, whole = _probe("give back some", 100, 80), _probe("give back", 100, 80)
    if not some["took"]:
        pytest.skip("not glibc's allocator: nothing to ask")
    mib = 1024  # (the figures are KiB)
    assert some["made"] - 140 * mib < some["freed"] < some["made"] - 60 * mib
    assert whole["freed"] < whole["made"] - 190 * mib  # (all of it, asked for all)
    assert whole["faults"] >= 20  # 80 MiB faulted in afresh: 2 MiB pages or 4 KiB ones
    assert some["faults"] < whole["faults"] // 10
