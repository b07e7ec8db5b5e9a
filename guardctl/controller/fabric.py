"""Fabric findings as the controller's log holds them, for every surface that shows them.

A fabric finding (a leaf switch, an uplink, a spine group or a node's link at fault;
:class:`guardctl.analyze.fabric.FabricFinding`) is noted in the action log as ``control
fabric`` records (:func:`guardctl.controller.record.record_fabric`): phase ``open`` when the
component is found or its nodes change, ``cleared`` when no pass finds it any more, and
``quarantine`` with what came of keeping new jobs off its nodes. ``guardctl status``, ``report``,
``export`` and ``control --explain`` read what is open from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from guardctl.actionlog import Entry
from guardctl.controller.ladder import FABRIC, derive
from guardctl.nodes import fold


def open_fabric(entries: Iterable[Entry]) -> dict[str, Entry]:
    """component -> its newest ``control fabric`` record, for the components whose finding is
    open (found and not cleared since), oldest first."""
    out: dict[str, Entry] = {}
    for e in entries:
        if e.action != FABRIC:
            continue
        name = str(e.evidence.get("component", ""))
        phase = e.evidence.get("phase")
        if phase == "open":
            out.pop(name, None)
            out[name] = e
        elif phase == "cleared":
            out.pop(name, None)
    return out


def fabric_now(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    """The fabric findings open in the log, as ``status``, ``export`` and ``report`` show them:
    the newest record's finding, when it was first found (``since``), and the nodes the
    controller holds quarantined for it (``quarantined``)."""
    first: dict[str, float] = {}
    for e in entries:
        if e.action != FABRIC:
            continue
        name, phase = str(e.evidence.get("component", "")), e.evidence.get("phase")
        if phase == "cleared":
            first.pop(name, None)
        elif phase == "open":
            first.setdefault(name, e.ts)
    ladders = derive(entries)
    return [
        {
            **{k: v for k, v in e.evidence.items() if k != "phase"},
            "nodes": list(e.nodes),
            "since": first.get(name, e.ts),
            "quarantined": sorted(n for n, lad in ladders.items() if lad.fabric == name),
        }
        for name, e in open_fabric(entries).items()
    ]


def fabric_text(f: Mapping[str, Any]) -> str:
    """A fabric finding (``FabricFinding.as_dict()``) in one line: the component, its nodes,
    the confidence, the evidence for and against, and what would settle it."""
    against = "; ".join(f.get("evidence_against") or ()) or "none"
    return (
        f"fabric {f['component']} at fault (confidence {float(f['confidence']):.2f}; "
        f"{fold(f['nodes'])}): {'; '.join(f.get('evidence_for') or ()) or '-'}; "
        f"against: {against}; to settle: {f.get('settle') or '-'}"
    )
