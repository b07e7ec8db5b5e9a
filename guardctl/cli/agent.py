"""``guardctl agent``: run the node's telemetry agent (foreground, for systemd)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import click

from guardctl.agent.daemon import Agent, node_name, run_forever
from guardctl.cli.base import AppContext, echo_json, echo_table, json_option, main, pass_app
from guardctl.errors import StoreError, UsageError
from guardctl.sections.agent import AgentSettings
from guardctl.storage import store


def _agent_settings(app: AppContext, interval: float | None, node: str | None) -> AgentSettings:
    changes: dict[str, Any] = {}
    if interval is not None:
        changes["interval_s"] = interval
    if node is not None:
        changes["node"] = node
    try:
        return dataclasses.replace(app.settings.agent, **changes)
    except ValueError as exc:
        raise UsageError(f"--interval: {str(exc).partition(': ')[2] or exc}") from None


def _print_status(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(status)
        return
    rows = [
        [c["name"], c["state"], f"{c['duration_s'] * 1000:.1f}", c["records"], c["error"]]
        for c in status["collectors"]
    ]
    echo_table(rows, ["collector", "state", "ms", "records", "detail"])
    store = status["store"]
    click.echo(
        f"store {store['root']}: {'writable' if store['writable'] else 'NOT writable'}, "
        f"{store['written']} written, {store['buffered']} buffered, {store['dropped']} dropped"
    )


@main.command("agent")
@click.option(
    "--store",
    "store_root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Store directory (default: store.root).",
)
@click.option(
    "--interval", type=float, help="Seconds between samples, 1-10 (default: agent.interval_s)."
)
@click.option("--node", help="Node name in records (default: agent.node, else the short hostname).")
@click.option("--once", is_flag=True, help="Take one sample of every collector, write it, exit.")
@json_option
@pass_app
def agent_command(
    app: AppContext,
    store_root: Path | None,
    interval: float | None,
    node: str | None,
    once: bool,
    as_json: bool,
) -> None:
    """Sample GPUs (NVML), the host and InfiniBand ports into the shared store.

    Runs in the foreground until SIGTERM. With --once, prints each collector's
    state, duration and record count (--json for the full status) and exits 8
    if the store could not be written. The store must carry the marker that
    'guardctl store init' wrote (exit 8 otherwise: the shared filesystem is not mounted).
    """
    if as_json and not once:
        raise UsageError("--json needs --once (the running agent reports in agent.status_file)")
    settings = _agent_settings(app, interval, node)
    if once:
        # The status file is the running agent's: a one-off check prints its own instead.
        settings = dataclasses.replace(settings, status_file="")
    root = store_root or app.settings.store.root
    # At start the agent refuses a store that is not mounted (exit 8, one line), so that systemd
    # shows the unit failed; later it buffers while the marker is missing (a mount gone away).
    store.require_marked(root)
    logging.basicConfig(level=logging.INFO, format="guardctl agent: %(message)s")
    agent = Agent(
        settings, root, node_name(settings.node), segment_minutes=app.settings.store.segment_minutes
    )
    if not once:
        run_forever(agent)
        return
    try:
        agent.sample()
        _print_status(agent.status(), as_json)
    finally:
        agent.close()
    if not agent.store.state.writable:
        raise StoreError(f"store not written: {agent.store.state.error}")
