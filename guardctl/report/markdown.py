"""The report as Markdown (for mail): summary, nodes to act on, history."""

from __future__ import annotations

from guardctl.report.actions import Actions
from guardctl.report.content import sections, summary
from guardctl.report.timeline import Timeline


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(tl: Timeline, source: str, acts: Actions | None = None) -> str:
    out = ["# guardctl fleet health report", ""]
    out += [f"- **{k}**: {_cell(v)}" for k, v in summary(tl, source, acts)]
    for sec in sections(tl, acts):
        out += ["", f"## {sec.title}", "", sec.note, ""]
        if not sec.rows:
            out.append("None.")
            continue
        out.append("| " + " | ".join(sec.headers) + " |")
        out.append("|" + "---|" * len(sec.headers))
        out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in sec.rows]
    return "\n".join(out) + "\n"
