"""guardctl sweep: qualify nodes with burn-in and all-reduce jobs, then drain or return them."""

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
from guardctl.controller.fabric import fabric_text
from guardctl.errors import ExitCode
from guardctl.nodes import expand_all
from guardctl.storage import store
from guardctl.sweep.engine import SweepOptions, SweepReport, run_sweep


def _progress(message: str) -> None:
    click.echo(f"guardctl: {message}", err=True)


def _print(report: SweepReport) -> None:
    if report.dry_run:
        click.echo(f"dry run: sweep of {', '.join(report.nodes)} ({report.kind}); nothing changed")
        echo_table(
            [(a["node"], a["action"], a["outcome"], a["message"]) for a in report.actions],
            headers=("NODE", "ACTION", "OUTCOME", "DETAIL"),
        )
        click.echo("")
        echo_table(
            [
                (p["sweep"], ",".join(p["nodes"]), p["reservation"], p["program"], p["backend"])
                for p in report.planned
            ],
            headers=("SWEEP JOB", "NODES", "RESERVATION", "PROGRAM", "BACKEND"),
        )
        return
    click.echo(f"sweep {report.sweep_id}: results in {report.directory}")
    echo_table(
        [(v.node, v.verdict, v.action, v.evidence) for v in report.verdicts],
        headers=("NODE", "VERDICT", "ACTION", "EVIDENCE"),
    )
    for finding in report.fabric:  # a switch or uplink at fault: no node drained for it
        click.echo(fabric_text(finding))


@main.command("sweep")
@click.argument("nodes", nargs=-1, required=True)
@click.option(
    "--kind",
    type=click.Choice(["single", "multi", "all"]),
    default="all",
    show_default=True,
    help="single: GEMM burn-in and all-reduce inside each node; multi: all-reduce "
    "with known-good partners; all: both.",
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
def sweep(
    app: AppContext,
    nodes: tuple[str, ...],
    kind: str,
    duration: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Quarantine NODES, run sweep jobs in the quarantine, judge against the baseline,
    release the nodes that pass and drain those that fail (a failure is repeated once first).
    A node whose jobs measured nothing (cancelled, node failure, program missing, pending until
    the timeout, no GPU backend) is undetermined: it stays quarantined, neither drained nor
    released. --dry-run lists each job's program and the backend it would use on its node.

    NODES are hostlist expressions (node[1-4,7]). Exits 1 when a node failed or is undetermined.
    """
    store.require_marked(app.settings.store.root)
    options = SweepOptions(kind=kind, duration_s=duration, dry_run=dry_run)  # type: ignore[arg-type]
    report = run_sweep(app.settings, expand_all(nodes), options, progress=_progress)
    if as_json:
        echo_json(report.as_dict())
    else:
        _print(report)
    if report.failed:
        sys.exit(int(ExitCode.FINDINGS))
