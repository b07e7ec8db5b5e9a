"""``guardctl analyze``: one detection pass over telemetry, a verdict per node."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from guardctl.analyze import SUSPECT, analyze
from guardctl.analyze.engine import bad_summary, build_cache
from guardctl.analyze.timespec import iso, parse_duration, parse_time
from guardctl.cli.base import AppContext, echo_json, echo_table, json_option, main, pass_app
from guardctl.controller.impact import describe
from guardctl.errors import ExitCode, InputError


@main.command("analyze")
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    help="A schema-v1 file, a directory of *.jsonl, or a store root "
    "(default: the configured store).",
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
@click.option(
    "--build-cache",
    is_flag=True,
    help="Parse every file into the columnar cache and exit (no verdicts).",
)
@json_option
@pass_app
def analyze_cmd(
    app: AppContext,
    input_path: Path | None,
    window: str | None,
    at: str | None,
    build_cache: bool,
    as_json: bool,
) -> None:
    """Judge every node seen in the telemetry: healthy, suspect or unknown.

    Exits 1 when a node is suspect. Nodes are compared with their peers in the
    same job and window; a node must be flagged in persist_k of the last
    persist_n windows to become suspect.
    """
    settings = app.settings
    if build_cache:
        stats = _build_cache(input_path, settings)
        echo_json(stats) if as_json else click.echo(
            f"cached {stats['records']} records from {stats['files']} files "
            f"({stats['bad_total']} bad lines) in {stats['cache']}"
        )
        return
    window_s = parse_duration(window, "--window") if window else None
    at_ts = parse_time(at, "--at") if at else None
    result = analyze(input_path, settings, at_ts, window_s=window_s)
    if not result.records:
        source = input_path if input_path is not None else settings.store.root
        raise InputError(
            f"{source}: no valid telemetry records "
            f"({result.files} files; bad lines: {bad_summary(result.bad)})"
        )
    if as_json:
        echo_json(result.to_dict())
    else:
        _print_table(result)
    if result.suspects:
        sys.exit(int(ExitCode.FINDINGS))


def _build_cache(input_path: Path | None, settings: object) -> dict[str, object]:
    return build_cache(input_path, settings)  # type: ignore[arg-type]


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
    counts = {
        v: sum(1 for n in result.nodes if n.verdict == v) for v in (SUSPECT, "unknown", "healthy")
    }
    click.echo(
        f"\nwindow {iso(result.window_start)} .. {iso(result.window_end)}; "
        f"{counts[SUSPECT]} suspect, {counts['unknown']} unknown, {counts['healthy']} healthy; "
        f"read {result.records} records from {result.files} files; "
        f"bad lines: {bad_summary(result.bad)}"
    )
