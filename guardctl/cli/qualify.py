"""guardctl qualify: sweep nodes back from someone else's repair (and a due sample) before use."""

from __future__ import annotations

import sys

import click

from guardctl.cli.base import (
    AppContext,
    dry_run_option,
    echo_json,
    echo_table,
    json_option,
    main,
    pass_app,
)
from guardctl.errors import ExitCode
from guardctl.storage import store
from guardctl.sweep.qualify import QualifyReport, qualify


def _progress(message: str) -> None:
    click.echo(f"guardctl: {message}", err=True)


def _print(report: QualifyReport) -> None:
    if report.sweep is None:
        click.echo("qualify: no node back from repair and no sample due: nothing to sweep")
    elif report.dry_run:
        click.echo(f"dry run: would sweep {', '.join(report.sweep.nodes)}; nothing changed")
        echo_table(
            [(a["node"], a["action"], a["outcome"], a["message"]) for a in report.sweep.actions],
            headers=("NODE", "ACTION", "OUTCOME", "DETAIL"),
        )
    else:
        click.echo(f"sweep {report.sweep.sweep_id}: results in {report.sweep.directory}")
        echo_table(
            [(v.node, v.verdict, v.action, v.evidence) for v in report.sweep.verdicts],
            headers=("NODE", "VERDICT", "ACTION", "EVIDENCE"),
        )
    if report.deferred:
        click.echo(f"deferred (cap): {', '.join(report.deferred)}")


@main.command("qualify")
@click.option(
    "--kind",
    type=click.Choice(["single", "multi", "all"]),
    default="all",
    show_default=True,
    help="Which sweeps the qualification runs (as guardctl sweep).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="S",
    help="GEMM burn-in seconds per node (default: sweep.gemm_duration_s).",
)
@dry_run_option
@json_option
@pass_app
def qualify_cmd(
    app: AppContext, kind: str, duration: float | None, dry_run: bool, as_json: bool
) -> None:
    """Sweep every node that came back to service after someone else drained or downed it
    (a repair) since the last look, and the sample of idle healthy nodes that is due
    (sweep.qualify_sample), before production work lands on them; passing figures feed the
    baselines. The first run only remembers who is held. Exits 1 when a node failed.
    """
    store.require_marked(app.settings.store.root)
    report = qualify(
        app.settings,
        dry_run=dry_run,
        kind=kind,  # type: ignore[arg-type]
        duration_s=duration,
        progress=_progress,
    )
    if as_json:
        echo_json(report.as_dict())
    else:
        _print(report)
    if report.failed:
        sys.exit(int(ExitCode.FINDINGS))
