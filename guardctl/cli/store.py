"""``guardctl store init|check|prune|compact|migrate``: mark the shared store, validate telemetry
files, apply retention, close ended segments, bring an older store up to date."""

from __future__ import annotations

import sys
import time
from pathlib import Path

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

store_option = click.option(
    "--store",
    "store_root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Store directory (default: store.root).",
)


@main.group("store")
def store_group() -> None:
    """Inspect and maintain the shared telemetry store."""


@store_group.command("init")
@click.argument("path", type=click.Path(path_type=Path, file_okay=False))
def init_command(path: Path) -> None:
    """Mark PATH as the site's shared store: once, at install time, with the shared filesystem
    mounted there. The agent, the controller and the hooks refuse (exit 8) a store root without
    this marker, so that an unmounted store is never replaced by a directory on local disk.
    Also lays out the store's directories with their modes: steps/ and dds/ 1777 (users' jobs
    write there), the rest 0755 (root-run daemons write there); run again, it repairs them.
    """
    marker = store.init(path)
    click.echo(f"{path}: marked as guardctl's shared store ({marker.name})")


@store_group.command("check")
@click.argument("path", type=click.Path(path_type=Path))
@json_option
def check_command(path: Path, as_json: bool) -> None:
    """Count good records per kind and bad lines per reason in PATH (file or directory).

    Also checks each file's column mirror (<hour>.cols) against the file. Exit 0
    when every line is a valid schema-v1 record and no mirror differs, 1 when
    some lines are bad or a mirror differs, 7 when PATH cannot be read.
    """
    report = store.check(path)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(
            f"{report.path}: {report.files} files, {report.lines} lines, "
            f"{sum(report.good.values())} good, {report.bad_total} bad"
        )
        rows = [["good", kind, n] for kind, n in sorted(report.good.items())]
        rows += [["bad", reason, n] for reason, n in sorted(report.bad.items())]
        if rows:
            echo_table(rows, ["", "kind / reason", "lines"])
        mirrors = ", ".join(f"{n} {state}" for state, n in sorted(report.mirrors.items()))
        click.echo(f"column mirrors: {mirrors or 'no files'}")
        for name in report.mirror_differs:
            click.echo(f"mirror differs from its file: {name}")
    if report.bad_total or report.mirror_differs:
        sys.exit(int(ExitCode.FINDINGS))


@store_group.command("prune")
@click.option(
    "--older-than",
    "older_than",
    metavar="DURATION",
    help="Delete segment files older than this, e.g. 7d, 12h (default: store.retention_days).",
)
@click.option(
    "--raw-older-than",
    "raw_older_than",
    metavar="DURATION",
    help="Delete the JSON Lines of closed segments older than this, e.g. 12h, 2d (default: "
    "store.raw_retention_hours; longer than --older-than means --older-than).",
)
@store_option
@dry_run_option
@json_option
@pass_app
def prune_command(
    app: AppContext,
    older_than: str | None,
    raw_older_than: str | None,
    store_root: Path | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete telemetry and step files whose segment is older than the retention, and sooner
    the JSON Lines of closed segments, which their Parquet files hold whole.

    Every file, JSON Lines and closed segment alike, goes after store.retention_days. The
    JSON Lines of a segment go after store.raw_retention_hours (default 24) when the segment
    is closed (guardctl store compact, or the controller's leader) and holds every one of its
    files to the last byte: readers then read it from Parquet. A segment not closed, or whose
    files changed since, keeps its files until it is closed again or the retention. The
    column mirrors of a closed segment's files go once it can no longer grow (3 hours after
    its end). Run it hourly: the store then holds a day of files, not the whole
    retention.
    """
    cfg = app.settings.store
    seconds = cfg.retention_days * 86400
    if older_than is not None:
        seconds = store.parse_duration(older_than)
    raw_seconds = cfg.raw_retention_hours * 3600
    if raw_older_than is not None:
        raw_seconds = store.parse_duration(raw_older_than)
    report = store.prune(
        store_root or cfg.root, seconds, raw_older_than_s=raw_seconds, dry_run=dry_run
    )
    if as_json:
        echo_json(report.to_dict())
        return
    verb = "would delete" if dry_run else "deleted"
    for name in report.files + report.raw_files:
        click.echo(f"{verb} {name}")
    click.echo(
        f"{verb} {len(report.files)} files past the retention, {report.bytes} bytes; "
        f"{sum(n.endswith('.jsonl') for n in report.raw_files)} JSON Lines files and "
        f"{sum(n.endswith('.cols') for n in report.raw_files)} column mirrors of closed "
        f"segments, {report.raw_bytes} bytes"
    )
    kept = ", ".join(f"{n} {why}" for why, n in sorted(report.raw_kept.items()))
    if kept:
        click.echo(f"kept past the raw retention: {kept}")


@store_group.command("compact")
@store_option
@json_option
@pass_app
def compact_command(app: AppContext, store_root: Path | None, as_json: bool) -> None:
    """Close every telemetry segment that has ended: its JSON Lines of every node written once
    as Parquet under segments/kind=/date=/hour=/, which the analyzer (and any engine that reads
    Parquet) reads instead. The controller's leader does this after each pass; run it from
    cron where no controller runs. Segments already closed and unchanged are left alone."""
    from guardctl.storage import compact  # the analyzer and pyarrow: only for this command

    root = store_root or app.settings.store.root
    cfg = app.settings.analyze
    report = compact.compact(
        root,
        time.time(),
        workers=cfg.parsers(),
        threads=cfg.pass_threads(),
        progress=None if as_json else _progress,
    )
    if as_json:
        echo_json(report.to_dict())
        return
    click.echo(
        f"{root}: closed {len(report.closed)} segments ({report.records} records); "
        f"{report.current} already closed, {report.open} still open"
    )


@store_group.command("migrate")
@store_option
@dry_run_option
@json_option
@pass_app
def migrate_command(app: AppContext, store_root: Path | None, dry_run: bool, as_json: bool) -> None:
    """Bring a store written by an earlier guardctl up to this version, once after an upgrade:
    close every segment that has ended (as `store compact`), and remove the analyzer's old
    cache of parsed telemetry (cache/analyze/), which nothing reads any more. The JSON Lines
    files stay. Until it runs, this version reads the old store as it is, only slower."""
    from guardctl.storage import compact  # the analyzer and pyarrow: only for this command

    root = store_root or app.settings.store.root
    report = compact.migrate(
        root,
        time.time(),
        dry_run=dry_run,
        workers=app.settings.analyze.parsers(),
        threads=app.settings.analyze.pass_threads(),
        progress=None if as_json else _progress,
    )
    if as_json:
        echo_json(report.to_dict())
        return
    verb = "would close" if dry_run else "closed"
    gone = "would remove" if dry_run else "removed"
    click.echo(
        f"{root}: {verb} {len(report.compacted.closed)} segments "
        f"({report.compacted.current} already closed); {gone} the old analyzer cache: "
        f"{len(report.removed)} files, {report.bytes} bytes"
    )


def _progress(segment: str) -> None:
    click.echo(f"closing segment {segment}", err=True)
