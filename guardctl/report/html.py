"""The report as one self-contained HTML page: tables plus plots as PNG data URIs (no network)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from guardctl.report.actions import Actions
from guardctl.report.content import sections, summary
from guardctl.report.plots import deviation_plot, heatmap
from guardctl.report.timeline import Timeline

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; font-size: 0.9em; }
th { background: #f3f3f3; }
figure { margin: 1em 0; }
img.plot { max-width: 100%; }
"""
# Says in the console when a plot could not be decoded: a broken report is caught by tests.
_CHECK = """
window.addEventListener("load", function () {
  var plots = document.querySelectorAll("img.plot"), ok = 0;
  plots.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { ok += 1; }
    else { console.error("guardctl report: plot " + img.id + " failed to load"); }
  });
  document.body.setAttribute("data-plots-loaded", String(ok));
});
"""


def _table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(tl: Timeline, source: str, acts: Actions | None = None) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>guardctl fleet health report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>guardctl fleet health report</h1>",
        _table(("", ""), [(k, v) for k, v in summary(tl, source, acts)]),
    ]
    for sec in sections(tl, acts):
        parts.append(f"<h2>{escape(sec.title)}</h2><p>{escape(sec.note)}</p>")
        parts.append(_table(sec.headers, sec.rows) if sec.rows else "<p>None.</p>")
    parts.append("<h2>Plots</h2>")
    for pid, caption, uri in (
        ("plot-deviation", "Per-node deviation over time", deviation_plot(tl)),
        ("plot-heatmap", "Fleet heatmap", heatmap(tl)),
    ):
        parts.append(
            f'<figure><img class="plot" id="{pid}" alt="{escape(caption)}" src="{uri}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>"
        )
    parts.append(f"<script>{_CHECK}</script></body></html>")
    return "\n".join(parts) + "\n"
