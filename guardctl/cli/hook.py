"""guardctl hook: the Slurm prolog, epilog and HealthCheckProgram entry (see slurm/README.md)."""

from __future__ import annotations

import sys

import click

from guardctl.cli.base import AppContext, dry_run_option, echo_json, json_option, main, pass_app
from guardctl.errors import ExitCode
from guardctl.hooks.run import run_hook


@main.command("hook")
@click.argument("hook", type=click.Choice(["prolog", "epilog", "healthcheck"]))
@click.option("--node", default="", help="This node's name (default: $SLURMD_NODENAME).")
@dry_run_option
@json_option
@pass_app
def hook(app: AppContext, hook: str, node: str, dry_run: bool, as_json: bool) -> None:
    """Run the quick node checks of a Slurm hook; on a failure drain the node through guardctl
    and exit 1 (a failing prolog makes Slurm requeue the job elsewhere). Where guardctl does
    not drain it (its cap, Slurm or the store unreachable, observe-only, a fleet-wide burst of
    one failing check) the hook says why and exits 0, unless hooks.fail_when_not_drained.
    """
    report = run_hook(app.settings, hook, node=node, dry_run=dry_run)  # type: ignore[arg-type]
    if as_json:
        echo_json(report.as_dict())
    else:
        # Slurm keeps a hook's output in slurmd's log: one line per finding, none when all is well.
        for r in report.failed:
            click.echo(f"guardctl {hook} {report.node}: {r.check}: {r.message}", err=True)
        if report.drained and report.fails:
            click.echo(f"guardctl {hook} {report.node}: {report.drained}", err=True)
        for alert in report.alerts:
            click.echo(f"guardctl {hook} {report.node}: ALERT: {alert}", err=True)
        if report.told_user:
            click.echo(
                f"guardctl {hook} {report.node}: note to the user {report.told_user}", err=True
            )
        if report.stragglers:
            click.echo(f"guardctl {hook} {report.node}: {report.stragglers}", err=True)
    if report.fails:
        sys.exit(int(ExitCode.FINDINGS))
