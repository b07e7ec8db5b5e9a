"""Fleet health reports for cron: Markdown for mail, self-contained HTML with plots.

:func:`make_report` runs the analyzer over a period (:mod:`.timeline`), reads what guardctl
did in it from the action log (:mod:`.actions`) and renders both (:mod:`.markdown`,
:mod:`.html`); ``findings`` tells the caller whether something needs an operator (a node
suspect at the end of the period that guardctl is not handling).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guardctl.config import Settings
from guardctl.errors import UsageError
from guardctl.report.actions import Actions, read_actions
from guardctl.report.timeline import Timeline, build_timeline
from guardctl.storage.source import Source, StoreSource

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
    """Analyse the *period_s* before *end* (default: the newest data) and render it as *fmt*.

    Telemetry comes from *source*, else from the store at *path* (default: the configured one).
    """
    if fmt not in FORMATS:
        raise UsageError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    source = source if source is not None else StoreSource(settings, path)
    tl = build_timeline(source, period_s, end=end, step_s=step_s)
    where = source.describe()
    acts = read_actions(settings.store.root, tl.start)
    if fmt == "html":
        from guardctl.report.html import render_html

        text = render_html(tl, where, acts)
    elif fmt == "json":
        text = json.dumps(report_data(tl, where, acts), indent=2) + "\n"
    else:
        from guardctl.report.markdown import render_markdown

        text = render_markdown(tl, where, acts)
    left = [n for n in tl.latest.suspects if not ((s := acts.of(n.node)) and s.next_step())]
    return Report(text, bool(left), tl)


def report_data(tl: Timeline, source: str, acts: Actions | None = None) -> dict[str, Any]:
    """The report as plain data (``--format json``)."""
    from guardctl.report.content import fleet_summary

    acts = acts or Actions()
    return {
        "schema": 1,
        "source": source,
        "period": {"start": tl.start, "end": tl.end},
        "passes": int(tl.times.size),
        "nodes_seen": len(tl.nodes),
        "suspect_now": [n.node for n in tl.latest.suspects],
        "ever_suspect": {n: tl.first_suspect(n) for n in tl.ever_suspect()},
        "latest": tl.latest.to_dict(),
        "fleet": dict(fleet_summary(tl, acts)),
        "guardctl_did": {
            n: {"steps": s.steps, "state": s.state, "operator": s.next_step()}
            for n, s in sorted(acts.stories.items())
        },
        "fabric": [
            {
                **{k: v for k, v in f.finding.items() if k != "phase"},
                "nodes": list(f.nodes),
                "found": f.found,
                "cleared": f.cleared,
                "quarantine": f.quarantine,
            }
            for f in acts.fabric
        ],
        "would_have_done": [
            {"ts": e.ts, "nodes": list(e.nodes), **e.evidence, "line": e.reason}
            for e in acts.rehearsal
        ],
        "action_log_problem": acts.problem,
    }
