"""``guardctl simulate cluster``: the mitigation policies compared on a simulated cluster."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from guardctl import extras
from guardctl.cli.base import echo_json, json_option
from guardctl.cli.simulate import simulate_cmd
from guardctl.errors import UsageError
from guardctl.simulate.cluster import report
from guardctl.simulate.cluster.params import Params
from guardctl.simulate.cluster.policies import CHOICES, NAMES
from guardctl.simulate.cluster.run import (
    FABRIC_POLICIES,
    compare,
    compare_fabric,
    control_settings,
)


@simulate_cmd.command("cluster")
@click.option("--nodes", type=int, default=None, help="Nodes of 8 GPUs [default: 2000].")
@click.option("--gpus", type=int, default=None, help="GPUs instead of --nodes (a multiple of 8).")
@click.option("--days", default=7.0, show_default=True, type=float, help="Simulated days.")
@click.option("--seed", default=0, show_default=True, type=int, help="The first seed.")
@click.option(
    "--seeds",
    default=1,
    show_default=True,
    type=int,
    help="Seeds to average over (seed, seed+1, ...).",
)
@click.option(
    "--policy",
    "policy_names",
    multiple=True,
    type=click.Choice(CHOICES),
    help="A policy to run (repeatable) [default: all but guardctl-fabric; with --fabric: "
    "guardctl and guardctl-fabric].",
)
@click.option(
    "--fault-scale", default=1.0, show_default=True, type=float, help="Every fault rate times this."
)
@click.option(
    "--recall", default=None, type=float, help="The analyzer's recall [default: 1.0, as measured]."
)
@click.option(
    "--relapses",
    default=None,
    type=int,
    help="control.relapses for guardctl's controller [default: its default].",
)
@click.option(
    "--sensitivity", is_flag=True, help="Also run fault rates x0.5 and x2 and recall 0.9."
)
@click.option(
    "--fabric",
    is_flag=True,
    help="Add fabric faults (a degraded leaf, a flapping uplink, a bad cable, a congested "
    "spine group) and compare today's node-only controller with the fabric-aware one.",
)
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(path_type=Path),
    help="Write table.md and PNG plots here.",
)
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@json_option
def cluster_cmd(
    nodes: int | None,
    gpus: int | None,
    days: float,
    seed: int,
    seeds: int,
    policy_names: tuple[str, ...],
    fault_scale: float,
    recall: float | None,
    relapses: int | None,
    sensitivity: bool,
    fabric: bool,
    report_dir: Path | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Simulate a GPU cluster over days and compare the mitigation policies on the same seeds.

    Policies: none, failstop (NHC), guard (a Guard-style baseline) and guardctl (the
    controller's own decisions). Prints goodput against a fault-free run, the large jobs'
    step-time variation, GPU-hours lost, drains and false drains per policy. With --fabric:
    the same node faults with fabric faults beside them, today's node-only controller
    (guardctl) against guardctl-fabric (told the cluster's tree): false drains, healthy nodes
    quarantined and swept, GPU-hours lost to the fabric faults, time to name the component.
    """
    if fabric and sensitivity:
        raise UsageError("give --fabric or --sensitivity, not both")
    if report_dir is not None:
        extras.need("report", "simulate cluster --report")  # before the simulation, not after
    params = _params(nodes, gpus, days, seed, fault_scale, recall, seeds)
    try:
        cfg = control_settings(params, **({"relapses": relapses} if relapses is not None else {}))
    except ValueError as exc:
        raise UsageError(f"--relapses: {exc}") from exc
    names = policy_names or (FABRIC_POLICIES if fabric else NAMES)
    progress = None if quiet else (lambda m: click.echo(f"simulate: {m}", err=True))
    seed_list = list(range(seed, seed + seeds))
    if fabric:
        result = compare_fabric(params, seed_list, names, cfg, progress)
    else:
        result = compare(params, seed_list, names, cfg, progress)
    cases = []
    if sensitivity:
        cases = [("as measured", result)] + [
            (label, compare(p, seed_list, names, cfg, progress))
            for label, p in (
                ("fault rates x0.5", params.scaled(0.5)),
                ("fault rates x2", params.scaled(2.0)),
                ("recall 0.9", dataclasses.replace(params, recall=0.9)),
            )
        ]
        result["sensitivity"] = {
            label: {n: r["policies"][n]["mean"] for n in names} for label, r in cases
        }
    if report_dir is not None:
        result["report"] = [str(p) for p in report.write(result, report_dir, cases)]
    if as_json:
        echo_json(result)
        return
    click.echo(
        f"{params.nodes} nodes ({params.nodes * params.gpus_per_node} GPUs), "
        f"{days:g} days, seeds {', '.join(map(str, seed_list))}"
        + (", fabric faults beside the node faults" if fabric else "")
    )
    click.echo(report.table(result))
    if cases:
        click.echo("")
        click.echo(report.sensitivity_table(cases))
    if report_dir is not None:
        click.echo(f"report: {report_dir}")


def _params(
    nodes: int | None,
    gpus: int | None,
    days: float,
    seed: int,
    fault_scale: float,
    recall: float | None,
    seeds: int,
) -> Params:
    if nodes is not None and gpus is not None:
        raise UsageError("give --nodes or --gpus, not both")
    if gpus is not None:
        if gpus <= 0 or gpus % 8:
            raise UsageError(f"--gpus {gpus}: must be a positive multiple of 8")
        nodes = gpus // 8
    if seeds < 1:
        raise UsageError(f"--seeds {seeds}: must be at least 1")
    if fault_scale < 0:
        raise UsageError(f"--fault-scale {fault_scale:g}: must be >= 0")
    try:
        params = Params(
            nodes=2000 if nodes is None else nodes,
            days=days,
            seed=seed,
            recall=1.0 if recall is None else recall,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return params.scaled(fault_scale) if fault_scale != 1.0 else params
