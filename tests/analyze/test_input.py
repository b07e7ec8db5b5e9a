"""Malformed and adversarial input: no crash, every bad line counted, the rest analysed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from anatrace import Trace, verdicts
from click.testing import CliRunner

from guardctl.analyze import analyze
from guardctl.analyze.frame import parse_lines
from guardctl.cli import main
from guardctl.config import Settings
from guardctl.telemetry import schema

GOOD = schema.dumps(
    schema.make_record("host", "n1", 1_764_547_200.0, cpu_pct=10.0, load1=1.0, mem_used_pct=5.0)
)

BAD_LINES: list[tuple[bytes, str]] = [
    (b"{not json", "not_json"),
    (b"\xff\xfe\x00garbage", "not_json"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":0,"temp_c":NaN}', "not_finite"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":0,"temp_c":Infinity}', "not_finite"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":"3"}', "wrong_type"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":true}', "wrong_type"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":0,"power_w":"high"}', "wrong_type"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":0,"ecc_dbe_volatile":1.5}', "wrong_type"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":0,"power_w":null}', "wrong_type"),
    (b'{"v":1,"kind":"gpu","ts":1.0,"node":"n1"}', "missing_field"),
    (b'{"v":2,"kind":"gpu","ts":1.0,"node":"n1","gpu":0}', "unknown_version"),
    (b'{"v":1,"kind":"disk","ts":1.0,"node":"n1"}', "unknown_kind"),
    (b'{"v":1,"kind":"host","ts":-5,"node":"n1"}', "bad_ts"),
    (b'{"v":1,"kind":"host","ts":"now","node":"n1"}', "bad_ts"),
    (b'{"v":1,"kind":"host","ts":1.0,"node":""}', "bad_node"),
    (b'{"v":1,"kind":"host","ts":1.0,"node":7}', "bad_node"),
    (b"[1, 2, 3]", "not_an_object"),
    (b"42", "not_an_object"),
    # nested past the decoders' limits: "not_json", or "not_an_object" where one copes
    (b"[" * 100_000 + b"]" * 100_000, "deep"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES, ids=[r for _, r in BAD_LINES])
def test_each_bad_line_is_counted_under_the_schemas_reason(line: bytes, reason: str) -> None:
    frame = parse_lines([GOOD.encode(), line, GOOD.encode()])
    assert frame.count("host") == 2
    if reason == "deep":
        assert dict(frame.bad) in ({"not_json": 1}, {"not_an_object": 1})
    else:
        assert dict(frame.bad) == {reason: 1}


def test_same_shape_with_bad_values_after_a_good_one_is_still_rejected() -> None:
    """The parser validates a record shape once; value checks must still apply per line."""
    good = b'{"v":1,"kind":"host","ts":5.0,"node":"n1","load1":1.0}'
    lines = [
        good,
        b'{"v":1,"kind":"host","ts":-1.0,"node":"n1","load1":1.0}',
        b'{"v":1,"kind":"host","ts":5.0,"node":"","load1":1.0}',
        b'{"v":3,"kind":"host","ts":5.0,"node":"n1","load1":1.0}',
        b'{"v":1,"kind":"host","ts":5.0,"node":"n1","load1":NaN}',
        good,
    ]
    frame = parse_lines(lines)
    assert frame.count("host") == 2
    assert dict(frame.bad) == {"bad_ts": 1, "bad_node": 1, "unknown_version": 1, "not_finite": 1}


def test_parser_agrees_with_schema_parse_line_on_random_corruptions() -> None:
    rng = random.Random(3)
    base = [
        schema.dumps(
            schema.make_record(
                "gpu",
                "n1",
                1000.0 + i,
                gpu=i % 8,
                sm_clock_mhz=1980,
                power_w=600.5,
                temp_c=60.0,
                xid=None if i % 3 else 79,
            )
        ).encode()
        for i in range(60)
    ]
    lines = []
    for line in base:
        b = bytearray(line)
        for _ in range(rng.randint(0, 3)):
            b[rng.randrange(len(b))] = rng.choice(b'0129"{}:,.-eE tn\xff')
        lines.append(bytes(b))
    expected_bad: dict[str, int] = {}
    good = 0
    for line in lines:
        try:
            schema.parse_line(line)
            good += 1
        except schema.BadRecord as exc:
            expected_bad[exc.reason] = expected_bad.get(exc.reason, 0) + 1
    frame = parse_lines(lines)
    assert frame.count("gpu") == good
    # a NaN/Infinity literal: the fast decoder refuses, the schema says not_finite: same count
    assert sum(frame.bad.values()) == sum(expected_bad.values())


def _write_trace(tmp_path: Path) -> Trace:
    tr = Trace(tmp_path / "store")
    tr.gpu["sm_clock_mhz"][tr.at(5) :, tr.node("gn03"), 1] = 1100
    tr.write()
    return tr


def _all_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.jsonl"))


def test_garbage_mixed_into_real_files_is_counted_and_the_rest_analysed(tmp_path: Path) -> None:
    tr = _write_trace(tmp_path)
    clean = verdicts(analyze(tr.root, Settings()))
    files = _all_files(tr.root / "telemetry")
    for i, f in enumerate(files):
        with f.open("ab") as fh:
            fh.write(BAD_LINES[i % len(BAD_LINES)][0] + b"\n")
    with files[0].open("ab") as fh:
        fh.write(b'{"v":1,"kind":"host","ts":1764548400.0,"no')  # cut short: no newline
    result = analyze(tr.root, Settings(), at=None)
    assert verdicts(result) == clean
    assert result.bad["truncated"] == 1
    assert sum(result.bad.values()) == len(files) + 1


def test_duplicated_and_shuffled_records_give_the_same_verdicts(tmp_path: Path) -> None:
    tr = _write_trace(tmp_path)
    clean = analyze(tr.root, Settings())
    rng = random.Random(5)
    for f in _all_files(tr.root):
        lines = f.read_text().splitlines()
        lines = lines + lines[: len(lines) // 2]  # an agent that replayed its buffer
        rng.shuffle(lines)  # and timestamps out of order
        f.write_text("\n".join(lines) + "\n")
    again = analyze(tr.root, Settings(), clean.window_end)
    assert verdicts(again) == verdicts(clean)
    assert verdicts(again)["gn03"] == "suspect"


def test_a_node_far_in_the_future_does_not_move_the_window(tmp_path: Path) -> None:
    tr = _write_trace(tmp_path)
    clean = analyze(tr.root, Settings())
    rogue = tr.root / "telemetry" / "rogue.jsonl"
    rogue.write_text(
        schema.dumps(
            schema.make_record("host", "rogue", clean.window_end + 10 * 365 * 86400, load1=1.0)
        )
        + "\n"
    )
    result = analyze(tr.root, Settings())
    assert result.window_end == clean.window_end
    assert verdicts(result)["gn03"] == "suspect"


def test_huge_file_and_huge_line(tmp_path: Path) -> None:
    tr = _write_trace(tmp_path)
    big = tr.root / "telemetry" / "gn01" / "huge.jsonl"
    big.parent.mkdir(exist_ok=True)
    with big.open("wb") as fh:
        fh.write(
            b'{"v":1,"kind":"host","ts":1.0,"node":"gn01","junk":"' + b"x" * (48 << 20) + b'"}\n'
        )  # one 48 MiB line: valid JSON, an unknown field
        fh.write(b"z" * (8 << 20) + b"\n")  # 8 MiB of non-JSON
        line = (schema.dumps(schema.make_record("host", "gn09", 1.0, load1=1.0)) + "\n").encode()
        fh.write(line * 200_000)  # and 200k small records of an old node
    result = analyze(tr.root, Settings())
    assert verdicts(result)["gn03"] == "suspect"
    assert result.bad.get("not_json") == 1


def test_cli_input_errors_are_one_line_with_documented_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["analyze", "--input", str(tmp_path / "nowhere")])
    assert res.exit_code == 7 and "no such file" in res.output
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.jsonl").write_text("garbage\n")
    res = runner.invoke(main, ["analyze", "--input", str(tmp_path / "empty")])
    assert res.exit_code == 7 and "no valid telemetry" in res.output and "not_json 1" in res.output
    for bad in (["--window", "five"], ["--window", "0"], ["--at", "yesterday"]):
        res = runner.invoke(main, ["analyze", "--input", str(tmp_path / "empty"), *bad])
        assert res.exit_code == 2, (bad, res.output)
        assert res.output.count("\n") == 1 and "Traceback" not in res.output


def test_cli_json_shape_and_exit_code(tmp_path: Path) -> None:
    tr = _write_trace(tmp_path)
    res = CliRunner().invoke(main, ["analyze", "--input", str(tr.root), "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)  # a historic trace: a warning on stderr
    assert doc["schema"] == 1 and set(doc["window"]) == {"start", "end"}
    assert doc["window"]["end"] - doc["window"]["start"] == pytest.approx(300)
    assert set(doc["input"]) == {"files", "records", "bad"}
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert len(nodes) == 6
    sick = nodes["gn03"]
    assert sick["verdict"] == "suspect" and sick["gpus"] == [1] and sick["score"] > 1
    ev = sick["evidence"][0]
    assert {"detector", "metric", "value", "reference", "deviation"} <= set(ev)
    assert all(n["verdict"] == "healthy" for k, n in nodes.items() if k != "gn03")
    # the same window, earlier: before the fault, exit 0
    res = CliRunner().invoke(
        main, ["analyze", "--input", str(tr.root), "--at", "2025-12-01T00:05:00Z"]
    )
    assert res.exit_code == 0, res.output
    assert "0 suspect" in res.output


def test_analyze_reads_the_configured_store_by_default(tmp_path: Path) -> None:
    tr = _write_trace(tmp_path)
    res = CliRunner().invoke(main, ["analyze", "--json"], env={"GUARDCTL_STORE": str(tr.root)})
    assert res.exit_code == 1, res.output
    assert {n["node"] for n in json.loads(res.stdout)["nodes"]} == set(tr.names)


def test_durations_and_times_as_operators_type_them() -> None:
    from guardctl.analyze.timespec import iso, parse_duration, parse_time
    from guardctl.errors import UsageError

    assert parse_duration("300") == 300 and parse_duration("5m") == 300
    assert parse_duration("24h") == 86400 and parse_duration("1.5d") == 129600
    assert parse_time("1764547200") == 1764547200.0
    assert parse_time("2025-12-01T00:00:00Z") == 1764547200.0
    assert parse_time("2025-12-01T01:00:00+01:00") == 1764547200.0
    assert parse_time("2025-12-01 00:00") == 1764547200.0  # naive = UTC
    assert iso(1764547200.0) == "2025-12-01T00:00:00Z"
    for bad in ("", "-5", "5 minutes", "nan", "0"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    for bad in ("soon", "-1", "inf"):
        with pytest.raises(UsageError):
            parse_time(bad)
