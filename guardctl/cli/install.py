"""guardctl install-hooks and guardctl uninstall: putting guardctl into a cluster and taking it out.

``install-hooks`` copies the Slurm hook scripts shipped with the package into a directory and
prints the slurm.conf lines to merge (merged with the site's own when given its slurm.conf);
run it again after an upgrade. ``uninstall`` lists what guardctl holds in Slurm and gives it
back through the node-action door (docs/operate/upgrade-uninstall.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from guardctl.cli.base import AppContext, dry_run_option, echo_json, json_option, main, pass_app
from guardctl.hooks import install as hooks_install
from guardctl.nodeops import NodeOps
from guardctl.nodeops.cleanup import give_back, refuse_while_leading


@main.command("install-hooks")
@click.option(
    "--prefix",
    type=click.Path(path_type=Path, file_okay=False),
    default=hooks_install.DEFAULT_PREFIX,
    show_default=True,
    help="Directory to install the hook scripts into (the same on every node).",
)
@click.option(
    "--slurm-conf",
    "slurm_conf",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The site's slurm.conf: merge with its PrologFlags, Prolog, Epilog and "
    "HealthCheckProgram instead of printing guardctl's alone.",
)
@dry_run_option
def install_hooks(prefix: Path, slurm_conf: Path | None, dry_run: bool) -> None:
    """Install the Slurm hook scripts from the package and print the slurm.conf lines to merge.

    Scripts go to PREFIX, mode 0755, each replaced atomically (an upgrade: run it again); a
    file there that is not one of guardctl's scripts is never overwritten (exit 6).
    """
    prefix = prefix.absolute()
    site = hooks_install.read_conf(slurm_conf) if slurm_conf else None
    copies = hooks_install.plan(prefix) if dry_run else hooks_install.install(prefix)
    for copy in copies:
        verb = "would " if dry_run and copy.action != "unchanged" else ""
        click.echo(f"# {verb}{copy.action}: {copy.target}")
    click.echo("# slurm.conf: merge these lines (one value per key), then `scontrol reconfigure`")
    for line in hooks_install.conf_lines(prefix, site):
        click.echo(line)


@main.command("uninstall")
@click.option(
    "--force",
    is_flag=True,
    help="Act even though a controller holds the lease (only when it is gone).",
)
@dry_run_option
@json_option
@pass_app
def uninstall(app: AppContext, force: bool, dry_run: bool, as_json: bool) -> None:
    """Release guardctl's quarantine and sweep reservations and resume the nodes it drained.

    Refused (exit 6) while a controller holds the lease, unless --force: stop the controller
    first. Anything that only looks like guardctl's (a reservation named like its own, a
    `guardctl:` drain reason that its action log does not account for) is listed, left alone.
    """
    if not (dry_run or force):
        refuse_while_leading(app.settings)
    done = give_back(NodeOps(app.settings), dry_run=dry_run)
    if as_json:
        echo_json([h.as_dict() for h in done])
        return
    if not done:
        click.echo("guardctl holds nothing in Slurm")
    for h in done:
        click.echo(f"{h.kind}: {h.name} ({h.detail}): {h.result}")
    if app.settings.safety.observe_only and not dry_run and done:
        click.echo("safety.observe_only is set: nothing was changed", err=True)
    click.echo(
        "then: remove guardctl's Prolog, Epilog and HealthCheckProgram lines from "
        "slurm.conf and `scontrol reconfigure`",
        err=True,
    )
