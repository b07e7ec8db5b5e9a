"""``guardctl report``: a fleet health report over a period, for cron (Markdown or HTML), with
what guardctl did (and, observing only, would have done) from the action log."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from guardctl import extras
from guardctl.analyze.timespec import parse_duration, parse_time
from guardctl.cli.base import AppContext, main, pass_app
from guardctl.errors import ExitCode
from guardctl.fileio import atomic_write
from guardctl.report import FORMATS, make_report
from guardctl.sources import open_source


@main.command("report")
@click.option("--period", default="24h", show_default=True, help="How far back to look.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="md",
    show_default=True,
    help="md for mail, html for a page with plots, json for scripts.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write here (atomically) instead of stdout.",
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    help="Telemetry to report on (default: the configured store).",
)
@click.option(
    "--from",
    "from_opt",
    nargs=2,
    metavar="KIND LOCATION",
    help="'prometheus URL' or 'store PATH', as for analyze (default: [source]).",
)
@click.option("--end", metavar="TIME", help="End of the period (default: the newest data).")
@click.option(
    "--step", metavar="DURATION", help="Time between analysis passes (default: one window)."
)
@pass_app
def report_cmd(
    app: AppContext,
    period: str,
    fmt: str,
    as_json: bool,
    output: Path | None,
    input_path: Path | None,
    end: str | None,
    step: str | None,
    from_opt: tuple[str, str] | None = None,
) -> None:
    """Write a fleet health report, each finding with what guardctl did about it; exit 1 when
    a suspect node is left to an operator (guardctl is not handling it)."""
    if as_json:
        fmt = "json"
    if fmt == "html":
        extras.need("report", "report --format html")
    source = open_source(app.settings, from_opt, input_path)
    report = make_report(
        None,
        app.settings,
        period_s=parse_duration(period, "--period"),
        fmt=fmt,
        end=parse_time(end, "--end") if end else None,
        step_s=parse_duration(step, "--step") if step else None,
        source=source,
    )
    if output is None:
        click.echo(report.text, nl=False)
    else:
        atomic_write(output, report.text)
    if report.findings:
        sys.exit(int(ExitCode.FINDINGS))
