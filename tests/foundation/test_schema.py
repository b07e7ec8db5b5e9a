"""Schema v1 validation: every malformed shape is a counted bad line, never an exception."""

from __future__ import annotations

import pytest

from guardctl.telemetry import schema


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"v":1,"kind":[],"ts":1.0,"node":"n1"}', "unknown_kind"),
        ('{"v":1,"kind":{"a":1},"ts":1.0,"node":"n1"}', "unknown_kind"),
        ('{"v":2,"kind":"gpu","ts":1.0,"node":"n1","gpu":0}', "unknown_version"),
        ('{"v":1,"kind":"gpu","ts":true,"node":"n1","gpu":0}', "bad_ts"),
        ('{"v":1,"kind":"gpu","ts":1.0,"node":"","gpu":0}', "bad_node"),
        ('{"v":1,"kind":"gpu","ts":1.0,"node":"n1"}', "missing_field"),
        ('{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":0,"temp_c":"hot"}', "wrong_type"),
        ('{"v":1,"kind":"gpu","ts":1.0,"node":"n1","gpu":0,"power_w":Infinity}', "not_finite"),
        ("[" * 100_000, "not_json"),
        ("[1, 2]", "not_an_object"),
    ],
)
def test_bad_lines(line: str, reason: str) -> None:
    with pytest.raises(schema.BadRecord) as info:
        schema.parse_line(line)
    assert info.value.reason == reason


def test_unknown_fields_ignored_and_null_xid_allowed() -> None:
    record = schema.parse_line(
        '{"v":1,"kind":"gpu","ts":1.5,"node":"n1","gpu":3,"xid":null,'
        '"row_remap_pending":0,"future_field":[1]}'
    )
    assert record["gpu"] == 3 and record["xid"] is None
