"""`guardctl store migrate` on a store the previous version wrote (tests/fixtures/stores/README.md).

The fixture holds hourly JSON Lines, column mirrors beside the node files, step files without
mirrors and the old analyzer's cache of them; beside it, what that version's `analyze --json`
said. This version must say the same before the migration (it reads the old store as it is),
after it (from the closed segments) and with the mirrors gone too.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from guardctl.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stores"
OLD = FIXTURES / "v0.1-hourly-mirrors-cache.tar.xz"


def _old_store(tmp_path: Path) -> Path:
    with tarfile.open(OLD) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "oldstore"


def _cli(store: Path, *args: str, code: int = 0) -> Any:
    res = CliRunner().invoke(main, [*args, "--json"], env={"GUARDCTL_STORE": str(store)})
    assert res.exit_code == code, res.output
    return json.loads(res.stdout)


def _verdicts(analysis: dict[str, Any]) -> dict[str, Any]:
    return {k: analysis[k] for k in ("nodes", "window", "summary", "jobs", "stages")}


def test_migrate_closes_segments_and_drops_the_old_cache(tmp_path: Path) -> None:
    store = _old_store(tmp_path)
    said = json.loads((FIXTURES / "v0.1-hourly-mirrors-cache.analysis.json").read_text())
    assert [n["node"] for n in said["nodes"] if n["verdict"] == "suspect"] == ["node0005"]
    old_cache = sorted(p for p in (store / "cache" / "analyze").rglob("*") if p.is_file())
    assert old_cache, "the fixture holds the old cache"

    before = _cli(store, "analyze", "--input", str(store), code=1)
    assert _verdicts(before) == _verdicts(said)

    planned = _cli(store, "store", "migrate", "--store", str(store), "--dry-run")
    assert planned["closed"] == ["20251130T23", "20251201T00"]
    assert not (store / "segments").exists() and (store / "cache" / "analyze").is_dir()

    done = _cli(store, "store", "migrate", "--store", str(store))
    assert done["closed"] == planned["closed"] and done["records"] == said["input"]["records"]
    assert sorted(done["removed"]) == sorted(str(p.relative_to(store)) for p in old_cache)
    assert not (store / "cache" / "analyze").exists()
    assert len(list((store / "segments").rglob("*.parquet"))) >= 4  # gpu, host, nic, step

    assert _verdicts(_cli(store, "analyze", "--input", str(store), code=1)) == _verdicts(said)
    for mirror in store.rglob("*.cols"):
        mirror.unlink()
    assert _verdicts(_cli(store, "analyze", "--input", str(store), code=1)) == _verdicts(said)

    again = _cli(store, "store", "migrate", "--store", str(store))
    assert again["closed"] == [] and again["current"] == 2 and again["removed"] == []


def test_compact_that_cannot_write_says_so_in_one_line(tmp_path: Path) -> None:
    store = _old_store(tmp_path)
    (store / "segments").write_text("a file where the directory should be")
    res = CliRunner().invoke(main, ["store", "compact", "--store", str(store)])
    assert res.exit_code == 8, res.output
    (line,) = [x for x in res.stderr.splitlines() if x.startswith("guardctl: error:")]
    assert "cannot write closed segment 20251130T23: Not a directory" in line
    assert "Traceback" not in res.output
    assert list(store.rglob("*.tmp")) == []


def test_compact_refuses_a_path_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "notes" / "20251201T00.jsonl").parent.mkdir()
    (tmp_path / "notes" / "20251201T00.jsonl").write_text("{}\n")
    res = CliRunner().invoke(main, ["store", "compact", "--store", str(tmp_path)])
    assert res.exit_code == 7, res.output
    assert res.stderr.strip() == (
        f"guardctl: error: {tmp_path}: not a store (no telemetry/ or steps/ directory)"
    )
    assert not (tmp_path / "segments").exists()
