"""Mixed mode reads ``--input`` as ``analyze --input`` does (a directory of ``*.jsonl`` too), and
says so loudly when the store kinds it asked for are not there.

Against the real Prometheus server of the ``prom_fleet`` fixture (conftest.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from promtools import SCRAPE_S, PromFleet

from guardctl.cli import main


def analyze_json(*args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    res = CliRunner().invoke(
        main, ["--set", f"source.step_s={SCRAPE_S}", "analyze", *args, "--json"]
    )
    return res.exit_code, json.loads(res.stdout), res.stderr


def test_a_directory_of_jsonl_files_is_read_beside_prometheus(
    prom_fleet: PromFleet, tmp_path: Path
) -> None:
    flat = tmp_path / "flat"  # the store's files side by side, as a user may gather them
    flat.mkdir()
    files = sorted(prom_fleet.store.rglob("*.jsonl"))
    for i, path in enumerate(files):
        shutil.copy(path, flat / f"{i:05d}-{path.name}")
    at = ("--at", str(prom_fleet.end))
    code, alone, _ = analyze_json("--input", str(flat), *at)
    assert code == 1
    code, mixed, said = analyze_json(
        "--from", "prometheus", prom_fleet.url, "--input", str(flat), *at
    )
    assert code == 1 and "warning" not in said
    # The probe's busy time, which only the step records carry, found the slow GPU here too.
    slow = next(f.node for f in prom_fleet.truth.faults if f.kind == "slow_gpu")
    found = next(n for n in mixed["nodes"] if n["node"] == slow)
    assert "busy_time" in {e["detector"] for e in found["evidence"]}
    faults = {f.node for f in prom_fleet.truth.faults}
    suspects = {n["node"] for n in mixed["nodes"] if n["verdict"] == "suspect"}
    assert suspects == faults == {n["node"] for n in alone["nodes"] if n["verdict"] == "suspect"}
    store = mixed["source"]["store"]
    assert store["path"] == str(flat) and store["kinds"] == ["step", "host"]
    assert 0 < store["files"] <= len(files) and store["records"] > 0  # (the hours needed)
    # A directory without a record of the store kinds: judged all the same, said loudly.
    gpu_only = tmp_path / "gpu-only"
    gpu_only.mkdir()
    agent = next(p for p in files if "telemetry" in p.parts)
    lines = [line for line in agent.read_text().splitlines() if json.loads(line)["kind"] == "gpu"]
    (gpu_only / "x.jsonl").write_text("\n".join(lines) + "\n")
    code, thin, said = analyze_json(
        "--from", "prometheus", prom_fleet.url, "--input", str(gpu_only), *at
    )
    assert code == 1 and thin["source"]["store"]["records"] == 0
    assert said.splitlines() == [
        f"guardctl: warning: no step/host records (source.store_kinds) in {gpu_only} (1 files "
        "read): judged on Prometheus's series alone, without what only those records show; "
        "give --input the store or directory the agents and the probe write"
    ]
    assert slow not in {n["node"] for n in thin["nodes"] if n["verdict"] == "suspect"}
