"""What ``import guardctl.probe`` costs a training rank, against a bare interpreter, in one run.

Every training rank imports the probe, so its import time and memory are paid
once per rank. Each case runs in a fresh interpreter, alternating with the
baseline (``python -c pass``) so that both see the same machine:

- ``bare``: ``python -c pass``;
- ``probe``: ``python -c "import guardctl.probe"``;
- ``agent``: ``python -c "import guardctl.agent.daemon"`` (the node agent's code).

Reported per case: the best wall time of ``--runs`` starts, the peak resident
memory (``ru_maxrss`` of that child), how many modules it imported, and whether
numpy or the analyzer came along. ``--before DIR`` adds the probe and agent
cases run against another checkout of guardctl (say, the previous release),
so that before and after are measured in the same run, against one baseline.

    python bench/import_cost.py [--runs 15] [--before DIR] [--json]
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


def _env(tree: str | None) -> dict[str, str] | None:
    # (run in *tree* too: ``python -c`` puts the working directory first on sys.path)
    return None if tree is None else {**os.environ, "PYTHONPATH": tree}


def start(code: str, tree: str | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one fresh interpreter running *code*."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(tree), cwd=tree)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{code!r} failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss / 1024  # kilobytes on Linux


def what_it_imports(code: str, tree: str | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\n{REPORT}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=_env(tree),
        cwd=tree,
    )
    return json.loads(out.stdout.splitlines()[-1])


def measure(runs: int, before: str | None) -> dict[str, Any]:
    cases: dict[str, tuple[str, str | None]] = {name: (code, None) for name, code in CASES.items()}
    if before is not None:
        cases["probe@before"] = (CASES["probe"], before)
        cases["agent@before"] = (CASES["agent"], before)
    walls: dict[str, list[float]] = {name: [] for name in cases}
    rss: dict[str, list[float]] = {name: [] for name in cases}
    for code, tree in cases.values():  # warm the page cache and the .pyc files
        start(code, tree)
    for _ in range(runs):
        for name, (code, tree) in cases.items():  # interleaved: the same load on every case
            wall, mib = start(code, tree)
            walls[name].append(wall)
            rss[name].append(mib)
    out: dict[str, Any] = {"runs": runs, "python": sys.version.split()[0], "cases": list(cases)}
    bare_s, bare_mib = min(walls["bare"]), min(rss["bare"])
    for name, (code, tree) in cases.items():
        out[name] = {
            "wall_ms": min(walls[name]) * 1e3,
            "over_bare_ms": (min(walls[name]) - bare_s) * 1e3,
            "vs_bare": min(walls[name]) / bare_s,
            "peak_rss_mib": min(rss[name]),
            "over_bare_mib": min(rss[name]) - bare_mib,
            **what_it_imports(code, tree),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="starts per case (best is kept)")
    parser.add_argument("--before", metavar="DIR", help="another guardctl checkout to compare")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    result = measure(args.runs, args.before)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"import cost, best of {result['runs']} fresh interpreters (Python {result['python']})")
    for name in result["cases"]:
        r = result[name]
        print(
            f"  {name:12} {r['wall_ms']:6.1f} ms (+{r['over_bare_ms']:5.1f} ms, "
            f"{r['vs_bare']:.2f}x bare)  peak RSS {r['peak_rss_mib']:5.1f} MiB "
            f"(+{r['over_bare_mib']:4.1f})  {r['modules']} modules, "
            f"numpy {'yes' if r['numpy'] else 'no'}, analyzer {'yes' if r['analyze'] else 'no'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
