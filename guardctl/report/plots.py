"""Report plots: matplotlib (Agg, no display) rendered to PNG data URIs for self-contained HTML."""

from __future__ import annotations

import base64
import io
from datetime import UTC, datetime

import matplotlib

matplotlib.use("Agg")  # reports run from cron: never look for a display

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from guardctl.report.timeline import Timeline

MAX_LINES = 12  # nodes drawn in the deviation plot
MAX_ROWS = 200  # nodes drawn in the heatmap


def _data_uri(fig: plt.Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _dates(times: np.ndarray) -> list[datetime]:
    return [datetime.fromtimestamp(float(t), UTC) for t in times]


def worst_nodes(tl: Timeline, limit: int) -> list[int]:
    """Indices of the nodes with the highest peak score (those ever flagged)."""
    if not tl.nodes:
        return []
    peak = tl.scores.max(axis=0)
    order = np.argsort(-peak, kind="stable")
    return [int(i) for i in order[:limit] if peak[i] > 0]


def deviation_plot(tl: Timeline) -> str:
    """Score over time of the most deviant nodes (1.0 = at a detector's threshold)."""
    fig, ax = plt.subplots(figsize=(10, 3.6))
    when = mdates.date2num(_dates(tl.times))
    for i in worst_nodes(tl, MAX_LINES):
        ax.plot(when, tl.scores[:, i], marker=".", linewidth=1.2, label=tl.nodes[i])
    ax.xaxis_date()
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_ylabel("score (1 = threshold)")
    ax.set_title("Per-node deviation over time (most deviant nodes)")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no node deviated in this period", transform=ax.transAxes, ha="center")
    fig.autofmt_xdate()
    return _data_uri(fig)


def heatmap(tl: Timeline) -> str:
    """Verdict of every node (rows) at every pass (columns); flagged nodes first."""
    rows = worst_nodes(tl, MAX_ROWS)
    rest = [i for i in range(len(tl.nodes)) if i not in set(rows)]
    rows = (rows + rest)[:MAX_ROWS]
    data = tl.verdicts[:, rows].T if rows else np.full((1, max(1, tl.times.size)), -1)
    # none/healthy/unknown/suspect/watch, as VERDICT_CODE + 1
    cmap = ListedColormap(["#eeeeee", "#8fd18f", "#f2c14e", "#d9534f", "#9ecae1"])
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.12 * len(rows)))
    ax.imshow(data + 1, aspect="auto", cmap=cmap, vmin=0, vmax=4, interpolation="nearest")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([tl.nodes[i] for i in rows], fontsize=6)
    ticks = np.linspace(0, max(tl.times.size - 1, 0), num=min(8, max(tl.times.size, 1)))
    ax.set_xticks(ticks)
    ax.set_xticklabels(
        [_dates(tl.times[[int(t)]])[0].strftime("%H:%M") if tl.times.size else "" for t in ticks],
        fontsize=7,
    )
    title = "Fleet heatmap: green healthy, blue watch, yellow unknown, red suspect, grey no data"
    if len(tl.nodes) > len(rows):
        title += f" ({len(rows)} of {len(tl.nodes)} nodes, flagged first)"
    ax.set_title(title, fontsize=9)
    return _data_uri(fig)
