"""guardctl baseline: show or relearn the sweep baselines (per GPU model and node shape)."""

from __future__ import annotations

import time

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
from guardctl.sweep import baseline


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


@main.group("baseline")
def baseline_group() -> None:
    """Learnt sweep baselines: what a healthy device model achieves in this fleet."""


@baseline_group.command("show")
@json_option
@pass_app
def show(app: AppContext, as_json: bool) -> None:
    """Show every baseline: key (sweep|device|shape), value, how many figures, when updated."""
    found = baseline.load_all(app.settings.store.root)
    if as_json:
        echo_json({"baselines": [b.as_dict() for b in found.values()]})
        return
    if not found:
        click.echo("no baselines yet: sweeps judge against the fleet median of each run")
        return
    echo_table(
        [
            (b.key, f"{b.value:.4g}", b.metric, len(b.history), _when(b.updated))
            for b in found.values()
        ],
        headers=("KEY", "VALUE", "UNIT", "FIGURES", "UPDATED"),
    )


@baseline_group.command("update")
@click.option(
    "--sweep",
    "sweep_ids",
    multiple=True,
    metavar="ID",
    help="Learn from these sweeps only (repeatable); default: every stored sweep.",
)
@dry_run_option
@json_option
@pass_app
def update(app: AppContext, sweep_ids: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Recompute baselines from the passing figures of stored sweeps."""
    dry = dry_run or app.settings.safety.observe_only
    built = baseline.rebuild(
        app.settings.store.root,
        keep=app.settings.sweep.baseline_history,
        sweep_ids=sweep_ids,
        dry_run=dry,
    )
    if as_json:
        echo_json({"dry_run": dry, "baselines": [b.as_dict() for b in built]})
        return
    verb = "would write" if dry else "wrote"
    click.echo(f"{verb} {len(built)} baseline(s)")
    echo_table(
        [(b.key, f"{b.value:.4g}", b.metric, len(b.history)) for b in built],
        headers=("KEY", "VALUE", "UNIT", "FIGURES"),
    )
