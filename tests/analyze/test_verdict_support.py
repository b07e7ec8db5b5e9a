"""A verdict says only what the telemetry supports: a node flagged but not yet persistent is
``watch``, a node whose telemetry is too short or whose ranks had nothing to compare with is
``unknown`` with why, never ``healthy``; the summaries count them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anatrace import Trace, verdicts
from click.testing import CliRunner

from guardctl.cli import main
from guardctl.export import prometheus_text

SICK = "gn03"


def last_seconds(tr: Trace, seconds: float) -> None:
    """The job ran only for the trace's last *seconds* (its steps; the agents ran throughout)."""
    end = float(tr.t[-1])
    every = tr.step_records

    def recent() -> list[dict[str, Any]]:
        return [r for r in every() if r["ts"] > end - seconds]

    tr.step_records = recent  # type: ignore[method-assign]


def test_a_short_jobs_straggler_is_watched_not_healthy(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    last_seconds(tr, 120)  # a 120 s job in 300 s windows: flagged in 1 of 3 windows at most
    tr.slow[:, tr.node(SICK), 2] = 3.0
    result = tr.analyze()
    v = result.verdict_of(SICK)
    assert v is not None and v.verdict == "watch" and v.score > 1, v
    assert v.reasons[0] == "flagged in 1 of 3 windows (needs 2): not persistent yet"
    assert {n: s for n, s in verdicts(result).items() if n != SICK} == dict.fromkeys(
        ["gn01", "gn02", "gn04", "gn05", "gn06"], "healthy"
    )
    assert result.counts() == {"suspect": 0, "watch": 1, "unknown": 0, "healthy": 5}
    assert result.to_dict()["summary"] == result.counts()


def test_a_probe_only_job_shorter_than_persistence_is_unknown(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    tr.present[:] = False  # no agents: the ranks' step records are all there is
    last_seconds(tr, 120)
    tr.slow[:, tr.node(SICK), 2] = 3.0
    result = tr.analyze()
    assert result.counts() == {"suspect": 0, "watch": 1, "unknown": 5, "healthy": 0}
    quiet = result.verdict_of("gn01")
    assert quiet is not None and quiet.verdict == "unknown"
    assert quiet.reasons[0].startswith("too short to judge: 1 of the last 3 windows hold enough")
    slow = result.verdict_of(SICK)
    assert slow is not None and slow.verdict == "watch"
    assert any(r.startswith("too short to judge") for r in slow.reasons)


def test_a_two_rank_job_slow_from_its_start_is_unknown(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    tr.ranks[:] = False
    tr.ranks[tr.node(SICK), 0] = tr.ranks[tr.node("gn01"), 0] = True
    tr.slow[:, tr.node(SICK), 0] = 3.0  # from its first step: no earlier self to compare with
    last_seconds(tr, 240)
    result = tr.analyze()
    for node in (SICK, "gn01"):
        v = result.verdict_of(node)
        assert v is not None and v.verdict == "unknown", v
        assert v.reasons[0].startswith("ranks not judged: fewer than 3 ranks doing the same work")
    assert result.counts() == {"suspect": 0, "watch": 0, "unknown": 2, "healthy": 4}


def test_the_cli_and_the_export_count_watched_and_unknown_nodes(tmp_path: Path) -> None:
    tr = Trace(tmp_path)
    last_seconds(tr, 120)
    tr.slow[:, tr.node(SICK), 2] = 3.0
    result = tr.analyze()
    table = CliRunner().invoke(main, ["analyze", "--input", str(tr.root)])
    assert table.exit_code == 0, table.output  # nothing persistent: no finding
    assert "0 suspect, 1 watch, 0 unknown, 5 healthy" in table.output
    assert any(line.split()[:2] == [SICK, "watch"] for line in table.output.splitlines())
    shown = json.loads(
        CliRunner().invoke(main, ["analyze", "--input", str(tr.root), "--json"]).stdout
    )
    assert shown["summary"] == {"suspect": 0, "watch": 1, "unknown": 0, "healthy": 5}
    text = prometheus_text(result)
    assert 'guardctl_analyze_nodes{verdict="watch"} 1.0' in text
    assert f'guardctl_node_watch{{node="{SICK}"}} 1.0' in text
