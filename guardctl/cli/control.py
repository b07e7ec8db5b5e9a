"""guardctl control: the mitigation controller, one pass (--once) or a daemon (--interval)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import click

from guardctl.analyze.impact import describe
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
from guardctl.controller.loop import Controller, PassReport, holder_line, serve
from guardctl.errors import ExitCode, UsageError
from guardctl.nodes import validate_name
from guardctl.storage import store


def _warn(message: str) -> None:
    click.echo(f"guardctl: {message}", err=True)


def _print(report: PassReport) -> None:
    if not report.leader:
        click.echo(holder_line(report))
        return
    mode = "acting" if report.acting else "observe only (control.act = false): nothing changed"
    if report.held_back:
        mode = f"observing only this pass, nothing changed: {report.held_back}"
    click.echo(
        f"controller pass: {mode}; {len(report.findings)} flagged, "
        f"{len(report.fleet)} fleet-wide finding(s), {len(report.fabric)} fabric finding(s)"
    )
    if report.source is not None:
        missing = ", ".join(report.source["missing"]) or "nothing"
        click.echo(
            f"source: prometheus {report.source['url']}: {report.source['series']} "
            f"series, {report.source['samples']} samples; not given: {missing}"
        )
    for f in report.fleet:
        click.echo(f"fleet-wide ({f['scope']} {f['name']}): {f['why']}")
    for f in report.fabric:
        click.echo(fabric_text(f))
        held = f.get("quarantine")
        if held:
            click.echo(f"  quarantine {len(held['nodes'])} node(s): {held['outcome']}")
    rows = [
        (d["node"], d["kind"] or "-", d["rung"], d["decision"], d["outcome"] or "-", d["why"])
        for d in report.decisions
    ]
    if rows:
        echo_table(rows, ("NODE", "FINDING", "RUNG", "DECISION", "OUTCOME", "WHY"))
    for f in report.findings:
        if f.get("impact"):
            click.echo(describe(f["node"], f["impact"]))


def _print_explain_component(data: dict[str, Any]) -> None:
    f = data["finding"]
    click.echo(f"{data['component']}: {data['state']} (topology: {data['topology']})")
    if f:
        click.echo(f"  confidence: {float(f['confidence']):.2f}")
        for line in f["evidence_for"]:
            click.echo(f"  for:        {line}")
        for line in f["evidence_against"]:
            click.echo(f"  against:    {line}")
        click.echo(f"  settle:     {f['settle']}")
    keep = "quarantined till it clears" if data["fabric_quarantine"] else "none (the default)"
    click.echo(f"  node action: {keep} (control.fabric_quarantine)")
    for n in data["nodes"]:
        d = n["decision"]
        owner = n["owner"][0] + (" for this component" if n["fabric_quarantine"] else "")
        what = f"{d['decision']}: {d['why']}" if d else "nothing to decide"
        click.echo(f"  node:       {n['node']}: {owner}; {what}")
    for e in data["history"]:
        click.echo(f"  history:    {e['evidence'].get('phase', '')}: {e['reason']}")


def _print_explain(data: dict[str, Any]) -> None:
    if "component" in data:
        _print_explain_component(data)
        return
    d, f = data["decision"], data["finding"]
    click.echo(
        f"{data['node']}: {data['owner'][0]}"
        + (f" ({data['owner'][1]})" if data["owner"][1] else "")
    )
    click.echo(f"  finding:  {f['kind']}: {f['why']}" if f else "  finding:  not flagged")
    if data["impact"]:
        click.echo(f"  impact:   {data['impact']}")
    if data["jobs"]:
        click.echo(f"  jobs:     {', '.join(map(str, data['jobs']))}")
    for fleet in data["fleet"]:
        click.echo(f"  fleet:    {fleet['why']}")
    for fabric in data.get("fabric", ()):
        click.echo(f"  fabric:   {fabric_text(fabric)}")
    click.echo(
        f"  decision: {d['decision']} (rung {d['rung']}): {d['why']}"
        if d
        else "  decision: nothing to decide"
    )
    watch = (d or {}).get("rebalance") or data["ladder"].get("rebalance")
    if watch:
        click.echo(f"  rung a:   {_watch_line(watch)}")
    if data["ladder"].get("sweeping"):
        running = data["ladder"]["sweeping"]
        click.echo(
            f"  sweeping: sweep {running.get('sweep')} (pid {running.get('pid')} on "
            f"{running.get('host')})"
        )
    sweeps = data["ladder"]["sweeps"]
    if sweeps:
        click.echo("  sweeps:   " + ", ".join(s["verdict"] for s in sweeps))
    for e in data["history"]:
        ev = e["evidence"]
        what = ev.get("decision") or ev.get("verdict") or ""
        click.echo(f"  history:  {' '.join(filter(None, (e['action'], what)))}: {e['reason']}")


def _watch_line(watch: dict[str, Any]) -> str:
    """Rung a's watch of the job's step time: its phase and figures."""
    if "phase" not in watch:
        return str(watch.get("why", ""))
    line = (
        f"{watch['phase']}: job {watch['job']} step time {watch['step_s']:.4g} s at rung a, "
        f"{watch['step_s_without']:.4g} s at its peers' pace"
    )
    if watch.get("step_s_now") is not None:
        line += f", {watch['step_s_now']:.4g} s now"
        if watch.get("won_back_pct") is not None:
            line += f" ({watch['won_back_pct']:g}% won back)"
    return line + (f", {watch['waited_s']:.0f} s since" if "waited_s" in watch else "")


@main.command("control")
@click.option("--once", is_flag=True, help="One pass, then exit (for a systemd timer or cron).")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="S",
    help="Seconds between passes of the daemon; with control.align, "
    "its windows end on a multiple of it (default: control.interval_s; a single "
    "pass judges up to the newest record).",
)
@click.option(
    "--act",
    is_flag=True,
    help="Act (default: control.act; otherwise observe only and record what it would do).",
)
@click.option(
    "--explain",
    "explain_node",
    metavar="NODE",
    help="Say why the controller chooses what it chooses for NODE, or what it makes of a "
    "fabric component (leaf:s1, uplink:s1, spine:s0, link:node3); change nothing.",
)
@dry_run_option
@json_option
@pass_app
def control(
    app: AppContext,
    once: bool,
    interval: float | None,
    act: bool,
    explain_node: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """The mitigation controller: from the newest analysis to quarantine, sweep, drain,
    release or requeue, through guardctl's safety rules, with nobody in the loop.

    One controller leads at a time (a lease in the store); another one observes and says
    so. Observe-only unless control.act = true or --act. The analysis comes from [source]:
    guardctl's store, or Prometheus (with the store's source.store_kinds). Exits 1 when a pass
    found a node at fault, 5 when Slurm did not answer, 7 when the telemetry source gave no
    complete answer (nothing was decided or done) (--once); a daemon says so in one line and
    carries on. Exits 8 at once when the store root lacks the marker of 'guardctl store init'
    (the shared filesystem is not mounted there).
    """
    settings = app.settings
    store.require_marked(settings.store.root)  # an unmounted store: exit 8, nothing done
    controller = Controller(settings, act=act or settings.control.act, progress=_warn)
    if explain_node is not None:
        data = (
            controller.explain_component(explain_node)
            if ":" in explain_node
            else controller.explain(validate_name(explain_node))
        )
        echo_json(data) if as_json else _print_explain(data)
        return
    emit = (lambda r: echo_json(r.as_dict())) if as_json else _print
    if once or dry_run:
        if interval is not None:
            raise UsageError("--interval runs a daemon: not with --once or --dry-run")
        try:
            report = controller.run_pass(dry_run=dry_run)
        finally:
            if not dry_run:
                controller.lease.release()
        emit(report)
        if any(f["kind"] == "persistent" for f in report.findings):
            sys.exit(int(ExitCode.FINDINGS))
        return

    def stop(_sig: int, _frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    serve(controller, interval or settings.control.interval_s, _on_change(emit), _warn)


def _on_change(emit: Callable[[PassReport], None]) -> Callable[[PassReport], None]:
    """A daemon prints a pass only when what it saw or chose differs from the pass before."""
    last: list[Any] = [None]

    def maybe(report: PassReport) -> None:
        now = (
            report.leader,
            report.acting,
            [(d["node"], d["decision"], d["why"], d["outcome"]) for d in report.decisions],
            report.fleet,
            [(f["component"], f["nodes"], f.get("quarantine")) for f in report.fabric],
        )
        if now != last[0]:
            emit(report)
            last[0] = now

    return maybe
