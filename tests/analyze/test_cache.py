"""The columnar cache: built once, only new bytes parsed, rebuilt when a file is rewritten."""

from __future__ import annotations

import json
from pathlib import Path

from anatrace import Trace

from guardctl.analyze import analyze, load
from guardctl.analyze.load import hour_of
from guardctl.config import Settings, load_settings
from guardctl.telemetry import schema


def _manifests(root: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(p.read_text()) for p in sorted((root / "cache").rglob("manifest.json"))]


def _store(tmp_path: Path) -> Trace:
    tr = Trace(tmp_path / "store", nodes=4, minutes=16)
    tr.gpu["sm_clock_mhz"][tr.at(4) :, tr.node("gn02"), 0] = 1100
    tr.write()
    return tr


def test_cache_gives_the_same_answer_and_parses_nothing_twice(tmp_path: Path) -> None:
    tr = _store(tmp_path)
    nocache = analyze(tr.root, load_settings(assignments=["analyze.cache=false"], environ={}))
    assert not (tr.root / "cache").exists()
    first = analyze(tr.root, Settings())
    before = _manifests(tr.root)
    second = analyze(tr.root, Settings())
    assert first.to_dict() == second.to_dict() == nocache.to_dict()
    assert _manifests(tr.root) == before  # nothing new: no new segment
    assert sum(len(m["segments"]) for m in before) >= 1


def test_appended_lines_are_parsed_incrementally(tmp_path: Path) -> None:
    tr = _store(tmp_path)
    base = load(tr.root, Settings())
    f = sorted((tr.root / "telemetry" / "gn01").glob("*.jsonl"))[-1]
    rec = schema.make_record("host", "gn01", float(tr.t[-1]) + 5, load1=15.0, cpu_pct=30.0)
    line = schema.dumps(rec)
    with f.open("a") as fh:
        fh.write(line[:20])  # a write in progress
    partial = load(tr.root, Settings())
    assert partial.count("host") == base.count("host")
    assert partial.bad["truncated"] == 1
    with f.open("a") as fh:
        fh.write(line[20:] + "\n")  # completed
    done = load(tr.root, Settings())
    assert done.count("host") == base.count("host") + 1
    assert done.bad.get("truncated", 0) == 0
    segs = [m["segments"] for m in _manifests(tr.root) if hour_of(f) in json.dumps(m) or True]
    assert sum(len(s) for s in segs) >= 2  # the tail went into its own segment


def test_rewritten_file_rebuilds_its_hour(tmp_path: Path) -> None:
    tr = _store(tmp_path)
    load(tr.root, Settings())
    f = sorted((tr.root / "telemetry" / "gn01").glob("*.jsonl"))[0]
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[: len(lines) // 2]) + "\n")  # shrunk: not an append
    again = load(tr.root, Settings())
    fresh = load(tr.root, load_settings(assignments=["analyze.cache=false"], environ={}))
    assert again.count("gpu") == fresh.count("gpu")


def test_damaged_or_unwritable_cache_is_never_fatal(tmp_path: Path) -> None:
    tr = _store(tmp_path)
    good = analyze(tr.root, Settings())
    for seg in (tr.root / "cache").rglob("seg*.cols"):
        seg.write_bytes(b"not a zip")
    assert analyze(tr.root, Settings()).to_dict() == good.to_dict()
    for m in (tr.root / "cache").rglob("manifest.json"):
        m.write_text("{oops")
    assert analyze(tr.root, Settings()).to_dict() == good.to_dict()
    import shutil

    shutil.rmtree(tr.root / "cache")
    (tr.root / "cache").write_text("a file where the cache directory should be")
    assert analyze(tr.root, Settings()).to_dict() == good.to_dict()
