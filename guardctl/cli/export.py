"""``guardctl export``: the analyzer's verdicts, the agents' health and the controller's
liveness and actions, for other systems."""

from __future__ import annotations

from pathlib import Path

import click

from guardctl import extras
from guardctl.cli.base import AppContext, dry_run_option, main, pass_app
from guardctl.errors import UsageError
from guardctl.sources import open_source


@main.command("export")
@click.option(
    "--prometheus",
    "prom",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write node-exporter textfile metrics here (e.g. "
    "/var/lib/node_exporter/textfile/guardctl.prom).",
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path),
    help="Telemetry to analyse (default: the configured store).",
)
@click.option(
    "--from",
    "from_opt",
    nargs=2,
    metavar="KIND LOCATION",
    help="'prometheus URL' or 'store PATH', as for analyze (default: [source]).",
)
@dry_run_option
@pass_app
def export_cmd(
    app: AppContext,
    prom: Path | None,
    input_path: Path | None,
    dry_run: bool,
    from_opt: tuple[str, str] | None = None,
) -> None:
    """Run one analysis pass; export its verdicts, each node's collectors, and the controller's
    liveness, actions and refusals from the store (atomically)."""
    if prom is None:
        raise UsageError("export: say where to write, e.g. --prometheus FILE")
    extras.need("export", "export")
    from guardctl.export import collect, prometheus_text, write_prometheus  # guardctl[export]

    result = collect(open_source(app.settings, from_opt, input_path))
    if dry_run:
        click.echo(prometheus_text(result), nl=False)
        return
    write_prometheus(result, prom)
