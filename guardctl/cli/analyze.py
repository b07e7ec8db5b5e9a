"""``guardctl analyze``: one detection pass over telemetry, a verdict per node."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from guardctl.analyze import Analysis
from guardctl.analyze.engine import (
    NOT_COMPARED,
    OWN_HISTORY,
    ahead_line,
    bad_summary,
    out_of_date,
)
from guardctl.analyze.impact import describe
from guardctl.analyze.timespec import iso, parse_duration, parse_time
from guardctl.cli.base import AppContext, echo_json, echo_table, json_option, main, pass_app
from guardctl.errors import ExitCode, InputError
from guardctl.nodes import fold
from guardctl.sources import open_source
from guardctl.storage.source import Source


@main.command("analyze")
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    help="A schema-v1 file, a directory of *.jsonl, or a store root "
    "(default: the configured store).",
)
@click.option(
    "--from",
    "from_opt",
    nargs=2,
    metavar="KIND LOCATION",
    help="Where telemetry comes from: 'prometheus URL' (dcgm-exporter and node_exporter "
    "series; step records still from --input or the store) or 'store PATH' "
    "(default: [source] in the configuration).",
)
@click.option(
    "--window",
    metavar="DURATION",
    help="Window length, e.g. 300 or 5m (default: analyze.window_s).",
)
@click.option(
    "--at",
    metavar="TIME",
    help="End of the newest window: Unix seconds or ISO time (default: the newest record).",
)
@json_option
@pass_app
def analyze_cmd(
    app: AppContext,
    input_path: Path | None,
    window: str | None,
    at: str | None,
    as_json: bool,
    from_opt: tuple[str, str] | None = None,
) -> None:
    """Judge every node seen in the telemetry: healthy, watch, suspect or unknown.

    Exits 1 when a node is suspect. Nodes are compared with their peers in the
    same job and window; a node must be flagged in persist_k of the last
    persist_n windows to become suspect (flagged fewer times: watch); one whose
    telemetry is too short to judge, or whose ranks had no peers and no history of
    their own, is unknown. With --from prometheus, a store (or directory) given by
    --input without any record of source.store_kinds is said in a warning line.
    Without --at, a newest window that is stale (telemetry stopped) or after now, and
    nodes stamping records ahead of this host's clock, are said in a warning line; the
    verdicts are reported all the same.
    """
    settings = app.settings
    window_s = parse_duration(window, "--window") if window else None
    at_ts = parse_time(at, "--at") if at else None
    source = open_source(settings, from_opt, input_path)
    result = source.analyze(at_ts, window_s=window_s)
    missing = source.coverage.store_warning() if source.coverage is not None else None
    if missing:  # loud: the busy-time signal is the one no exporter has
        click.echo(f"guardctl: warning: {missing}", err=True)
    if not result.records:
        raise InputError(
            f"{source.describe()}: no valid telemetry records "
            f"({result.files} files; bad lines: {bad_summary(result.bad)})"
        )
    if at_ts is None:  # a time asked for is the caller's to judge
        _warn_when_not_current(result, settings.control.max_clock_skew_s)
    if as_json:
        echo_json(_with_source(result.to_dict(), source))
    else:
        _print_table(result)
        if source.coverage is not None:
            click.echo(source.coverage.summary())
    if result.suspects:
        sys.exit(int(ExitCode.FINDINGS))


def _warn_when_not_current(result: Analysis, tolerance_s: float) -> None:
    now = time.time()
    for line in (ahead_line(result, now), out_of_date(result, now, tolerance_s)):
        if line:
            click.echo(f"guardctl: warning: {line}", err=True)


def _with_source(out: dict[str, object], source: Source) -> dict[str, object]:
    if source.coverage is not None:  # what the Prometheus source could and could not give
        out["source"] = source.coverage.to_dict()
    return out


def _print_table(result: object) -> None:
    from guardctl.analyze import Analysis

    assert isinstance(result, Analysis)
    rows = []
    for n in result.nodes:
        reason = n.reasons[0] if n.reasons else ""
        if len(n.reasons) > 1:
            reason += f" (+{len(n.reasons) - 1} more)"
        gpus = ",".join(map(str, n.gpus))
        rows.append((n.node, n.verdict, f"{n.score:.2f}", n.job or "-", gpus or "-", reason))
    echo_table(rows, ("NODE", "VERDICT", "SCORE", "JOB", "GPUS", "REASON"))
    costs = [describe(n.node, n.impact) for n in result.suspects if n.impact]
    if costs:
        click.echo("\nimpact: " + "; ".join(costs))
    for stage in result.stages:  # job-level: no node is to blame
        click.echo(f"\njob {stage.job}: {stage.why} (nodes {fold(stage.nodes)})")
    for job in result.slowed:  # job-level, against its own history: no node is to blame
        cost = job.impact or {}
        click.echo(
            f"\n{job.why}: {cost.get('pct', 0):g}% of each step lost, "
            f"{cost.get('gpu_h_lost', 0):g} GPU-h in those windows (nodes {fold(job.nodes)})"
        )
    counted = ", ".join(f"{count} {verdict}" for verdict, count in result.counts().items())
    # A job too small to compare its ranks is not a healthy finding: say how many were not.
    not_compared = _small_jobs(result)
    click.echo(
        f"\nwindow {iso(result.window_start)} .. {iso(result.window_end)}; "
        f"{counted}{not_compared}; "
        f"read {result.records} records from {result.files} files; "
        f"bad lines: {bad_summary(result.bad)}"
    )


def _small_jobs(result: Analysis) -> str:
    """How many nodes ran ranks too few peers could judge: not a healthy finding, say so."""
    counts = [
        sum(1 for n in result.nodes if any(r.startswith(p) for r in n.reasons))
        for p in (NOT_COMPARED, OWN_HISTORY)
    ]
    parts = [
        text
        for count, text in zip(
            counts,
            (
                f"{counts[0]} with ranks not judged: too few peers",
                f"{counts[1]} with ranks judged against their own history only",
            ),
            strict=True,
        )
        if count
    ]
    return f" ({'; '.join(parts)})" if parts else ""
