"""``guardctl simulate``: write a simulated fleet's telemetry with labelled faults, for testing.

``simulate`` is also the group of ``guardctl simulate cluster`` (:mod:`.simulate_cluster`);
called without a subcommand it writes a trace, as it always did.
"""

from __future__ import annotations

from pathlib import Path

import click

from guardctl.analyze.timespec import parse_duration, parse_time
from guardctl.cli.base import dry_run_option, echo_json, json_option, main
from guardctl.errors import UsageError
from guardctl.nodes import expand
from guardctl.simulate import DEFAULT_START, simulate
from guardctl.simulate.faults import CONFOUNDERS, FABRIC, FAULTS
from guardctl.simulate.fleet import LEAF


@main.group("simulate", invoke_without_command=True)
@click.option(
    "--out",
    "out",
    default=None,
    type=click.Path(path_type=Path),
    help="Directory to write (store layout) and truth.json (required without a subcommand).",
)
@click.option(
    "--nodes",
    default=64,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Nodes of 8 GPUs and 4 NIC ports each.",
)
@click.option(
    "--names",
    default=None,
    metavar="HOSTLIST",
    help="Node names instead of node0001..., e.g. 'node[1-8]' (sets --nodes).",
)
@click.option("--duration", default="30m", show_default=True, help="Trace length (e.g. 30m).")
@click.option("--interval", default="10s", show_default=True, help="Agent sampling interval.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--faults",
    default="all",
    show_default=True,
    help="Faults to inject: NAME[:COUNT] or NAME@NODE,... or all[:COUNT] or none. "
    f"Known: {', '.join(FAULTS.names())}. Fabric faults (named, never in 'all'; "
    "NAME@LEAF, @SPINE or @NODE): " + ", ".join(FABRIC.names()) + ".",
)
@click.option(
    "--leaf-size",
    default=LEAF,
    show_default=True,
    type=int,
    help="Nodes per leaf switch of the simulated network tree (written as OUT/topology.conf).",
)
@click.option(
    "--no-confounders",
    is_flag=True,
    help=f"Leave out the benign confounders ({', '.join(CONFOUNDERS.names())}).",
)
@click.option(
    "--no-column-files",
    is_flag=True,
    help="Write only the JSON Lines, no column mirrors (as a foreign or older writer).",
)
@click.option(
    "--handoff",
    is_flag=True,
    help="Ranks hand their step records to the node agent: one file per node and segment "
    "(default: each rank writes its own, as a probe with no agent on its node).",
)
@click.option(
    "--start",
    default=None,
    help="Time of the first sample (Unix or ISO; default 2025-12-01T00:00:00Z).",
)
@json_option
@dry_run_option
@click.pass_context
def simulate_cmd(
    ctx: click.Context,
    out: Path | None,
    nodes: int,
    names: str | None,
    duration: str,
    interval: str,
    seed: int,
    faults: str,
    leaf_size: int,
    no_confounders: bool,
    no_column_files: bool,
    handoff: bool,
    start: str | None,
    as_json: bool,
    dry_run: bool,
) -> None:
    """Write a schema-v1 trace of a simulated fleet under OUT, with OUT/truth.json.

    Then: guardctl analyze --input OUT. With the subcommand 'cluster': a fleet simulation of
    the mitigation policies instead (guardctl simulate cluster --help).
    """
    if ctx.invoked_subcommand is not None:
        return
    if out is None:
        raise UsageError("simulate: --out DIR is required (or: guardctl simulate cluster)")
    node_names = expand(names) if names else []
    if node_names:
        nodes = len(node_names)
    truth = simulate(
        out,
        nodes=nodes,
        names=node_names,
        duration=parse_duration(duration, "--duration"),
        interval=parse_duration(interval, "--interval"),
        seed=seed,
        faults=faults,
        confounders=not no_confounders,
        start=parse_time(start, "--start") if start else DEFAULT_START,
        dry_run=dry_run,
        column_files=not no_column_files,
        leaf_size=leaf_size,
        handoff=handoff,
    )
    summary = truth.to_dict()
    if as_json:
        echo_json(summary)
        return
    if dry_run:
        click.echo(f"would write {nodes} nodes to {out} (dry run: nothing written)")
    else:
        click.echo(f"wrote {truth.records} records for {nodes} nodes to {out}")
    for inj in truth.faults:
        where = f" GPU {inj.gpu}" if inj.gpu is not None else f" {inj.device or ''}"
        click.echo(f"  fault {inj.kind:<16} {inj.node}{where} from {inj.onset:.0f}")
    for fab in truth.fabric:
        click.echo(f"  fabric {fab.kind:<15} {fab.component} from {fab.onset:.0f}")
    if not dry_run:
        click.echo(f"truth: {out / 'truth.json'}")
