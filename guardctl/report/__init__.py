"""Fleet health reports for cron: Markdown for mail, self-contained HTML with plots.

:func:`make_report` runs the analyzer over a period (:mod:`.timeline`) and
renders it (:mod:`.markdown`, :mod:`.html`); ``findings`` tells the caller
whether something needs acting on (a node suspect at the end of the period).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guardctl.config import Settings
from guardctl.errors import UsageError
from guardctl.report.timeline import Timeline, build_timeline

if TYPE_CHECKING:
    from guardctl.sources import Source

FORMATS = ("md", "html", "json")


@dataclass(frozen=True)
class Report:
    """A rendered report and whether it holds something to act on."""

    text: str
    findings: bool
    timeline: Timeline


def make_report(
    path: Path | None,
    settings: Settings,
    *,
    period_s: float,
    fmt: str = "md",
    end: float | None = None,
    step_s: float | None = None,
    source: Source | None = None,
) -> Report:
    """Analyse the *period_s* before *end* (default: the newest data) and render it as *fmt*."""
    if fmt not in FORMATS:
        raise UsageError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    tl = build_timeline(path, settings, period_s, end=end, step_s=step_s, source=source)
    where = source.describe() if source else str(path if path is not None else settings.store.root)
    if fmt == "html":
        from guardctl.report.html import render_html

        text = render_html(tl, where)
    elif fmt == "json":
        text = json.dumps(report_data(tl, where), indent=2) + "\n"
    else:
        from guardctl.report.markdown import render_markdown

        text = render_markdown(tl, where)
    return Report(text, bool(tl.latest.suspects), tl)


def report_data(tl: Timeline, source: str) -> dict[str, Any]:
    """The report as plain data (``--format json``)."""
    return {
        "schema": 1,
        "source": source,
        "period": {"start": tl.start, "end": tl.end},
        "passes": int(tl.times.size),
        "nodes_seen": len(tl.nodes),
        "suspect_now": [n.node for n in tl.latest.suspects],
        "ever_suspect": {n: tl.first_suspect(n) for n in tl.ever_suspect()},
        "latest": tl.latest.to_dict(),
    }
