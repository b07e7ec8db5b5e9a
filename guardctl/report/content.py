"""What a report says, independent of its format: sections as titled tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from guardctl.analyze import SUSPECT, UNKNOWN, WATCH
from guardctl.analyze.engine import bad_summary
from guardctl.analyze.timespec import iso
from guardctl.controller.impact import describe
from guardctl.report.timeline import Timeline


@dataclass(frozen=True)
class Section:
    title: str
    note: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


def summary(tl: Timeline, source: str) -> list[tuple[str, str]]:
    latest = tl.latest
    now = latest.counts()
    return [
        ("Period", f"{iso(tl.start)} .. {iso(tl.end)} ({len(tl.times)} passes)"),
        ("Source", source),
        ("Nodes seen", str(len(tl.nodes))),
        ("Suspect now", str(now[SUSPECT])),
        ("Watch now (flagged, not persistent yet)", str(now[WATCH])),
        ("Unknown now (too little data to judge)", str(now[UNKNOWN])),
        ("Suspect at some point in the period", str(len(tl.ever_suspect()))),
        ("Input", f"{tl.records} records from {tl.files} files; bad lines: {bad_summary(tl.bad)}"),
    ]


def sections(tl: Timeline) -> list[Section]:
    latest = tl.latest
    act = [
        (
            n.node,
            f"{n.score:.2f}",
            n.job or "-",
            ",".join(map(str, n.gpus)) or "-",
            iso(tl.first_suspect(n.node) or tl.end),
            describe(n.node, n.impact) or "-",
            "; ".join(n.reasons[:3]),
        )
        for n in latest.suspects
    ]
    now = {n.node for n in latest.suspects}
    past = []
    for node in tl.ever_suspect():
        if node not in now:
            first = tl.first_suspect(node)
            past.append((node, iso(first) if first is not None else "-"))
    unknown = [(n.node, n.job or "-", n.reasons[0] if n.reasons else "-")
               for n in latest.nodes if n.verdict == UNKNOWN]  # fmt: skip
    return [
        Section(
            "Act on these: suspect now",
            "Flagged in enough recent windows; drain and sweep them (guardctl sweep).",
            ("node", "score", "job", "GPUs", "suspect since", "impact", "reasons"),
            act,
        ),
        Section(
            "Suspect earlier in the period, not now",
            "Recovered or intermittent: watch them.",
            ("node", "first suspect"),
            past,
        ),
        Section(
            "Unknown: too little telemetry to judge",
            "A gap in the newest window: check that the node agent is running; a run too "
            "short or a job too small to compare: nothing was judged.",
            ("node", "job", "why"),
            unknown,
        ),
    ]
