"""What ``import guardctl.probe`` costs a training rank, against a bare interpreter, in one run.

Every training rank imports the probe, so its import time and memory are paid
once per rank. Each case runs in a fresh interpreter, alternating with the
baseline (``python -c pass``) so that both see the same machine:

- ``bare``: ``python -c pass``;
- ``probe``: ``python -c "import guardctl.probe"``;
- ``agent``: ``python -c "import guardctl.agent.daemon"`` (the node agent's code).

Reported per case: the best wall time of ``--runs`` starts, the peak resident
memory (``ru_maxrss`` of that child), how many modules it imported, and whether
numpy or the analyzer came along.

    python bench/import_cost.py [--runs 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

CASES = {
    "bare": "pass",
    "probe": "import guardctl.probe",
    "agent": "import guardctl.agent.daemon",
}
REPORT = (
    "import sys, json; print(json.dumps({'modules': len(sys.modules), "
    "'numpy': 'numpy' in sys.modules, 'analyze': 'guardctl.analyze' in sys.modules}))"
)


def start(code: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one fresh interpreter running *code*."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code])
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{code!r} failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss / 1024  # kilobytes on Linux


def what_it_imports(code: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", f"{code}\n{REPORT}"], capture_output=True,
                         text=True, check=True, timeout=120)  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def measure(runs: int) -> dict[str, Any]:
    walls: dict[str, list[float]] = {name: [] for name in CASES}
    rss: dict[str, list[float]] = {name: [] for name in CASES}
    start(CASES["probe"])  # warm the page cache and the .pyc files
    for _ in range(runs):
        for name, code in CASES.items():  # interleaved: the same load on every case
            wall, mib = start(code)
            walls[name].append(wall)
            rss[name].append(mib)
    out: dict[str, Any] = {"runs": runs, "python": sys.version.split()[0]}
    bare_s, bare_mib = min(walls["bare"]), min(rss["bare"])
    for name, code in CASES.items():
        out[name] = {
            "wall_ms": min(walls[name]) * 1e3,
            "over_bare_ms": (min(walls[name]) - bare_s) * 1e3,
            "vs_bare": min(walls[name]) / bare_s,
            "peak_rss_mib": min(rss[name]),
            "over_bare_mib": min(rss[name]) - bare_mib,
            **what_it_imports(code),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="starts per case (best is kept)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    result = measure(args.runs)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"import cost, best of {result['runs']} fresh interpreters (Python {result['python']})")
    for name in CASES:
        r = result[name]
        print(f"  {name:6} {r['wall_ms']:6.1f} ms (+{r['over_bare_ms']:5.1f} ms, "
              f"{r['vs_bare']:.2f}x bare)  peak RSS {r['peak_rss_mib']:5.1f} MiB "
              f"(+{r['over_bare_mib']:4.1f})  {r['modules']} modules, "
              f"numpy {'yes' if r['numpy'] else 'no'}, analyzer {'yes' if r['analyze'] else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
