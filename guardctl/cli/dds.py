"""``guardctl dds``: run a job's data-sharding service and show its progress."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from guardctl import extras
from guardctl.cli.base import (
    AppContext,
    dry_run_option,
    echo_json,
    echo_table,
    json_option,
    main,
    pass_app,
)
from guardctl.dds.dataset import JobSpec, index_range, read_files_list
from guardctl.dds.logs import log_to
from guardctl.dds.paths import job_paths, prepare, read_address
from guardctl.dds.status import read_status
from guardctl.errors import GuardctlError, StoreError, UsageError

log = logging.getLogger("guardctl.dds")


@main.group()
def dds() -> None:
    """Dynamic data sharding for a training job (AntDT): serve shards, show progress."""


def _job(job: str | None) -> str:
    job = job or os.environ.get("SLURM_JOB_ID")
    if not job:
        raise UsageError("no job id: give --job or run inside a Slurm job")
    return job


@dds.command()
@click.option("--job", help="The job's id [default: $SLURM_JOB_ID].")
@click.option("--records", type=click.IntRange(min=1), help="Dataset = record indices 0..N-1.")
@click.option(
    "--files",
    "files_list",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Dataset = files listed here: lines '<records> <name>' or JSON [[name, records], ...].",
)
@click.option("--shard-size", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Shuffle seed.")
@click.option("--no-shuffle", is_flag=True, help="Visit shards in order every epoch.")
@click.option(
    "--global-batch",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Samples per step across all ranks (per-step mode).",
)
@click.option(
    "--exit-when-done",
    "linger_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Stop this many seconds after the last epoch is done (default: run until SIGTERM).",
)
@dry_run_option
@pass_app
def serve(
    app: AppContext,
    job: str | None,
    records: int | None,
    files_list: Path | None,
    shard_size: int,
    epochs: int,
    seed: int,
    no_shuffle: bool,
    global_batch: int,
    linger_s: float | None,
    dry_run: bool,
) -> None:
    """Serve one job's shards until SIGTERM; resume from its saved state if it has one.

    Without --records/--files the dataset saved by an earlier run of this job's
    service is used (restart after a crash). The address and the job's secret
    are published in the job's dds directory of the store, and the service's
    log (service.log, with the details of any error) is kept there too; the
    terminal gets one line per warning or error. It listens on dds.bind (by
    default the node's own address: what its hostname resolves to).

    Exit codes: 0 stopped by SIGTERM/SIGINT or --exit-when-done, 2 bad
    command line or a job without a saved dataset, 3 dds.bind unresolvable,
    6 another service runs for the job, 8 the store, the state database or
    the address cannot be used, 70 internal error (details in the log).
    """
    job = _job(job)
    if records is not None and files_list is not None:
        raise UsageError("give --records or --files, not both")
    spec = None
    if records is not None or files_list is not None:
        files = read_files_list(files_list) if files_list is not None else index_range(records or 0)
        spec = JobSpec(files, shard_size, epochs, seed, not no_shuffle, global_batch)
    paths = job_paths(app.settings, job)
    if dry_run:
        plan: dict[str, Any] = {"job": job, "directory": str(paths.dir), "state": str(paths.state)}
        if spec is not None:
            plan.update(records=spec.total, shards=spec.shards, epochs=spec.epochs)
        click.echo(f"would serve: {plan}")
        return

    extras.need("dds", "dds serve")
    from guardctl.dds import service as dds_service  # the server's packages: guardctl[dds]

    prepare(paths)
    log_to(paths.log)

    def ready(host: str, port: int) -> None:
        click.echo(
            f"dds: serving job {job} on {host}:{port} (state {paths.state}, log {paths.log})",
            err=True,
        )
        sys.stderr.flush()

    try:
        dds_service.serve(app.settings, job, spec, on_ready=ready, linger_s=linger_s)
    except GuardctlError as exc:  # said on the terminal by the CLI's handler; kept in the log
        log.error("the service stopped: %s", exc, extra={"quiet": True})
        raise
    except Exception:
        log.exception("the service failed", extra={"quiet": True})
        raise


@dds.command()
@click.argument("job")
@json_option
@pass_app
def status(app: AppContext, job: str, as_json: bool) -> None:
    """Progress of JOB's epoch, each worker's speed and share, leases in flight and expired."""
    paths = job_paths(app.settings, job)
    if not paths.state.exists():
        raise StoreError(f"job {job} has no data-sharding state in {paths.state_dir}")
    report = read_status(paths.state, job)
    address = read_address(paths.address)
    report["address"] = None if address is None else f"{address[0]}:{address[1]}"
    if as_json:
        echo_json(report)
        return
    _print_status(report)


def _print_status(report: dict[str, Any]) -> None:
    data, progress, leases = report["dataset"], report["progress"], report["leases"]
    epoch = "finished" if report["finished"] else f"{report['epoch'] + 1}/{data['epochs']}"
    if report["steps"] is not None:
        done = f"{progress['epoch_steps_done']}/{report['steps']['steps_per_epoch']} steps"
    else:
        done = f"{progress['epoch_shards_done']}/{data['shards']} shards"
    click.echo(
        f"job {report['job']}: mode {report['mode']}, epoch {epoch}, {done} of this epoch "
        f"done ({progress['epoch_fraction']:.1%}), address {report['address'] or '-'}"
    )
    click.echo(
        f"leases: {leases['in_flight']} in flight ({leases['overdue']} overdue), "
        f"{leases['expired']} expired, {leases['revoked']} revoked by a restore"
    )
    per_step = report["steps"] is not None
    rows = [
        [
            w["worker"],
            "-" if w["rank"] is None else w["rank"],
            "-" if w["speed"] is None else f"{w['speed']:.1f}",
            f"{w['share']:.1%}",
            *([w["last_step"]] if per_step else [w["shards_done"], w["in_flight"]]),
            f"{w['idle_s']:.0f}",
        ]
        for w in report["workers"]
    ]
    work = ["last step"] if per_step else ["shards", "leased"]
    if rows:
        echo_table(rows, ["worker", "rank", "samples/s", "share", *work, "idle s"])
