"""The schema-v1 reader on fuzzed input: never crashes, counts bad lines, keeps good ones."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guardctl.storage import store
from guardctl.telemetry.schema import FIELDS, REQUIRED, dumps, make_record, read_path

NODES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
VALUES: dict[tuple[type, ...], st.SearchStrategy[Any]] = {
    (int, float): st.one_of(st.integers(-(2**53), 2**53), FINITE),
    (int,): st.integers(0, 2**63),
    (str,): st.text(max_size=20),
    (bool,): st.booleans(),
}


@st.composite
def good_record(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(FIELDS)))
    values = {}
    for name, types in FIELDS[kind].items():
        if name in REQUIRED[kind] or draw(st.booleans()):
            values[name] = draw(VALUES[types])
    ts = draw(st.floats(min_value=0, max_value=4e9, allow_nan=False))
    return make_record(kind, draw(NODES), ts, **values)


def _spoil(record: dict[str, Any], how: int, draw: st.DrawFn) -> str:
    bad = dict(record)
    kind = bad["kind"]
    field = draw(st.sampled_from(sorted(FIELDS[kind])))
    if how == 0:
        bad[field] = float("nan")
        return json.dumps(bad)  # NaN as JSON's non-standard token
    if how == 1:
        wrong = {(str,): [5], (bool,): [[], {}, 1]}.get(FIELDS[kind][field], [[], {}, True])
        bad[field] = draw(st.sampled_from(wrong))
        return json.dumps(bad)
    if how == 2:
        bad["kind"] = draw(st.text(max_size=8).filter(lambda k: k not in FIELDS))
        return json.dumps(bad)
    if how == 3:
        text = dumps(record)
        return text[: draw(st.integers(1, len(text) - 1))]  # cut short mid-line
    # No lone surrogates: they cannot be written as UTF-8 (the bytes test covers bad UTF-8).
    chars = st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",))
    return draw(
        st.text(alphabet=chars, min_size=1).filter(
            lambda s: s.strip() != "" and not s.strip().startswith("{")
        )
    )


@st.composite
def bad_line(draw: st.DrawFn) -> str:
    return _spoil(draw(good_record()), draw(st.integers(0, 4)), draw)


LINES = st.lists(
    st.one_of(good_record().map(lambda r: (True, r)), bad_line().map(lambda s: (False, s))),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=LINES, torn_tail=st.booleans())
def test_reader_counts_bad_and_keeps_good(lines: list[tuple[bool, Any]], torn_tail: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.jsonl"
        text = "".join((dumps(item) if ok else item) + "\n" for ok, item in lines)
        if torn_tail and lines and lines[-1][0]:
            text = text[:-1]  # the last good line lost its newline: not to be trusted
        path.write_text(text, encoding="utf-8")
        result = read_path(path)
        report = store.check(path)
    goods = [item for ok, item in lines if ok]
    if torn_tail and lines and lines[-1][0]:
        goods = goods[:-1]
    assert result.records == goods
    assert result.bad_total == len(lines) - len(goods)
    assert report.bad_total == result.bad_total and sum(report.good.values()) == len(goods)


@settings(max_examples=200, deadline=None)
@given(blob=st.binary(max_size=400))
def test_reader_survives_arbitrary_bytes(blob: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "junk.jsonl"
        path.write_bytes(blob)
        result = read_path(path)
    assert result.lines == len(result.records) + result.bad_total
    assert result.bad_total <= blob.count(b"\n") + 1
