"""The analyzer's fast reading paths give exactly what the plain, record-by-record ones give.

Parsing checks whole batches a column at a time and falls back to one record
at a time when a batch holds anything invalid; segments are raw columns read
straight into the joined arrays; the store walk and the hour of a file name
take shortcuts. Each is compared here with the slow path it replaces.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guardctl.analyze import Frame
from guardctl.analyze.frame import _BATCH, parse_lines
from guardctl.analyze.load import _walk_jsonl
from guardctl.telemetry import schema

T0 = 1_764_547_200.0


def _good_records(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Valid records of every kind, with the optional fields sometimes left out or null."""
    out = []
    for i in range(n):
        node, ts = f"n{rng.randrange(12):02d}", T0 + i * 0.5
        kind = rng.choice(schema.KINDS)
        if kind == "gpu":
            values: dict[str, Any] = {
                "gpu": rng.randrange(8),
                "sm_clock_mhz": rng.choice([1980, 1980.0, 1410.5]),
                "power_w": rng.uniform(60, 700),
                "temp_c": rng.randrange(30, 90),
                "clock_event_reasons": rng.choice([0, 1, 4, 0x20]),
                "xid": rng.choice([None, 79, 13]),
                "ecc_sbe_volatile": rng.randrange(3),
            }
            for optional in ("power_w", "temp_c", "xid", "ecc_sbe_volatile"):
                if rng.random() < 0.1:
                    del values[optional]
        elif kind == "host":
            values = {"cpu_pct": rng.uniform(0, 100), "load1": rng.uniform(0, 99)}
            if rng.random() < 0.5:
                values["mem_used_pct"] = 40
        elif kind == "nic":
            values = {
                "device": f"mlx5_{rng.randrange(4)}",
                "port": 1,
                "rate_gbps": 400.0,
                "symbol_errors": rng.randrange(5),
                "xmit_wait": 2**63 + rng.randrange(5),  # beyond int64: saturated, still valid
            }
            if rng.random() < 0.8:
                values["state"] = rng.choice(["ACTIVE", "DOWN"])
        elif kind == "step":
            values = {
                "job": f"j{rng.randrange(3)}",
                "rank": rng.randrange(16),
                "step": i,
                "step_s": rng.uniform(4, 14),
            }
        else:
            ok = rng.random() < 0.7
            values = {
                "collector": rng.choice(["nvml", "host", "infiniband"]),
                "ok": ok,
                "duration_s": rng.uniform(0, 2),
            }
            if rng.random() < 0.8:
                values["state"] = "ok" if ok else rng.choice(["error", "timeout"])
                values["error"] = "" if ok else "NVMLError_Unknown: Unknown Error"
        record = schema.make_record(kind, node, ts, **values)
        if rng.random() < 0.05:
            record["extra"] = [1, {"ignored": True}]  # unknown fields are ignored
        out.append(record)
    return out


# JSON-valid ways to break a record: each still decodes, so it reaches the column checks.
def _corrupt(rng: random.Random, record: dict[str, Any]) -> Any:
    key = rng.choice([k for k in record if k != "extra"])
    return _corrupted(rng, record, key, rng.randrange(_WAYS))


_WAYS = 12


def _corrupted(rng: random.Random, record: dict[str, Any], key: str, how: int) -> Any:
    rec = dict(record)
    if how == 0:
        rec[key] = True
    elif how == 1:
        rec[key] = None
    elif how == 2:
        rec[key] = str(rec[key])
    elif how == 3:
        del rec[key]
    elif how == 4:
        rec[key] = -1
    elif how == 5:
        rec[key] = 1.5
    elif how == 6:
        rec[key] = ""
    elif how == 7:
        rec["v"] = rng.choice([2, 1.0, True, "1", None])
    elif how == 8:
        rec["kind"] = rng.choice(["disk", 3, None, 1.5, "GPU"])
    elif how == 9:
        # (an unhashable "kind" crashes schema.validate itself: left out here)
        rec[key] = [rec[key]] if key != "kind" else 0
    elif how == 10:
        return rng.choice([[rec], 42, "text", None, []])
    else:
        rec[key] = 2**64 - 1
    return rec


def _lines(records: list[Any]) -> list[bytes]:
    import json

    return [json.dumps(r, separators=(",", ":")).encode() for r in records]


def _expected(lines: list[bytes]) -> tuple[Counter[str], Counter[str]]:
    """Valid records per kind and bad lines per reason, as schema.parse_line sees them."""
    good: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    for line in lines:
        try:
            good[schema.parse_line(line)["kind"]] += 1
        except schema.BadRecord as exc:
            bad[exc.reason] += 1
    return good, bad


def _assert_same_frame(a: Frame, b: Frame) -> None:
    assert (a.nodes, a.jobs, a.ports, a.states) == (b.nodes, b.jobs, b.ports, b.states)
    for kind in schema.KINDS:
        assert list(a.cols[kind]) == list(b.cols[kind])
        for name, col in a.cols[kind].items():
            other = b.cols[kind][name]
            assert col.dtype == other.dtype, (kind, name)
            assert np.array_equal(col, other, equal_nan=True), (kind, name)


@pytest.mark.parametrize("seed", range(6))
def test_column_checks_agree_with_record_checks_and_the_schema(seed: int) -> None:
    rng = random.Random(seed)
    records: list[Any] = _good_records(rng, 3 * _BATCH)
    share = [0.0, 0.0005, 0.002, 0.02, 0.2, 0.5][seed]
    records = [_corrupt(rng, r) if rng.random() < share else r for r in records]
    lines = _lines(records)
    good, bad = _expected(lines)
    fast = parse_lines(lines)  # every line decodes: batches checked by columns
    slow = parse_lines([*lines, b"{cut"])  # one line that does not: all record by record
    assert {k: fast.count(k) for k in schema.KINDS if fast.count(k)} == dict(good)
    assert dict(fast.bad) == dict(bad)
    assert dict(slow.bad) == dict(bad + Counter(not_json=1))
    assert fast.lines == len(lines) and slow.lines == len(lines) + 1
    _assert_same_frame(fast, slow)


def test_each_single_bad_value_in_a_clean_batch_is_caught() -> None:
    """One corrupted record among good ones: the column checks alone must reject it."""
    rng = random.Random(4)
    clean = _good_records(rng, 64)
    full = {  # every field of each kind present
        "gpu": schema.make_record(
            "gpu",
            "n1",
            T0,
            gpu=1,
            sm_clock_mhz=1980,
            power_w=600.5,
            power_limit_w=700.0,
            temp_c=60.0,
            util_pct=99,
            clock_event_reasons=0,
            ecc_sbe_volatile=0,
            ecc_dbe_volatile=0,
            pcie_replay=0,
            nvlink_crc_errors=0,
            xid=None,
        ),
        "host": schema.make_record("host", "n1", T0, cpu_pct=5.0, load1=1.0, mem_used_pct=7),
        "nic": schema.make_record(
            "nic",
            "n1",
            T0,
            device="mlx5_0",
            port=1,
            state="ACTIVE",
            rate_gbps=400.0,
            symbol_errors=0,
            link_error_recovery=0,
            link_downed=0,
            rcv_errors=0,
            xmit_wait=5,
            xmit_bytes=10,
        ),
        "step": schema.make_record(
            "step", "n1", T0, job="j1", rank=0, step=3, step_s=5.0, compute_s=4.0, comm_s=1.0
        ),
    }
    for kind, record in full.items():
        for key in record:
            for how in range(_WAYS):
                bad_one = _corrupted(random.Random(how), record, key, how)
                lines = _lines([*clean[:30], bad_one, *clean[30:]])
                good, bad = _expected(lines)
                frame = parse_lines(lines)
                counts = {k: frame.count(k) for k in schema.KINDS if frame.count(k)}
                assert (counts, dict(frame.bad)) == (dict(good), dict(bad)), (kind, key, how)


def test_a_bad_record_late_in_a_batch_is_counted_and_the_batch_kept() -> None:
    rng = random.Random(11)
    records: list[Any] = _good_records(rng, _BATCH + 10)
    records[_BATCH - 3] = {**records[_BATCH - 3], "ts": -5}
    records[_BATCH + 4] = {**records[_BATCH + 4], "node": ""}
    lines = _lines(records)
    frame = parse_lines(lines)
    assert dict(frame.bad) == {"bad_ts": 1, "bad_node": 1}
    assert frame.records == len(lines) - 2


def test_many_small_files_equal_one_big_feed() -> None:
    """Lines fed file by file (as the reader does) give the frame of one feed."""
    from guardctl.analyze.frame import Parser

    rng = random.Random(5)
    records: list[Any] = _good_records(rng, 2 * _BATCH)
    records[700] = _corrupt(random.Random(1), records[700])
    lines = _lines(records)
    parser = Parser()
    for i in range(0, len(lines), 37):
        parser.feed_lines(lines[i : i + 37] + ([b"", b"  "] if i % 3 else []))
    parser.feed_lines([b"not json", *lines[:5]])  # a file with an undecodable line
    whole = parse_lines([*lines, b"not json", *lines[:5]])
    _assert_same_frame(parser.frame(), whole)
    assert dict(parser.bad) == dict(whole.bad)


def test_walk_finds_what_os_walk_finds(tmp_path: Path) -> None:
    top = tmp_path / "store"
    for rel in ("a/1.jsonl", "a/b/2.jsonl", "a/b/c/3.jsonl", "d/4.txt", "5.jsonl"):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text("{}\n")
    (top / "a" / "dir.jsonl").mkdir()  # a directory with the suffix is not a file
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "6.jsonl").write_text("{}\n")
    os.symlink(outside, top / "linked")  # a symlinked directory: listed, not entered
    os.symlink(top / "5.jsonl", top / "alias.jsonl")
    os.symlink(top / "missing", top / "broken.jsonl")
    expected = sorted(
        os.path.join(d, n)
        for d, _dirs, names in os.walk(os.fspath(top))
        for n in names
        if n.endswith(".jsonl")
    )
    assert sorted(_walk_jsonl(os.fspath(top))) == expected
    assert _walk_jsonl(os.fspath(tmp_path / "nowhere")) == []
