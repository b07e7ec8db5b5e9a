"""What kind of finding each suspect is, as AntDT and FALCON tell them apart.

* **transient**: host contention or a spike, no hardware signal, or flagged but not
  persistent: watched, never acted on;
* **persistent**: a node fault: hardware signals, or busy time behind its peers window after
  window: the node ladder;
* **structural**: too many of one job's, one rack's or the fleet's nodes at once, or one
  pipeline stage heavier on every replica of its job: a common cause, reported once as a
  fleet-wide finding, never a node action;
* **heterogeneity**: a slower device model mixed into a job: all the job's nodes of that model
  and no others are slow: per-rank shares through the data-sharding service, no drain.

Pure functions of the analysis and the ``[control]`` settings, tested by handing them values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from guardctl.analyze.engine import SUSPECT, Analysis, NodeVerdict
from guardctl.analyze.fabric import (
    NETWORK,
    FabricFinding,
    PairResult,
    forming,
    localise,
    symptoms_of,
)
from guardctl.nodes import expand
from guardctl.sections.control import ControlSettings
from guardctl.topology import Topology

Kind = Literal["transient", "persistent", "structural", "heterogeneity", "fabric"]

# Detectors whose flags are the hardware speaking (GPU clocks, thermals, power, memory errors,
# XIDs, links); busy_time is the job's own measurement, host_contention is someone else's load.
HARDWARE = frozenset(
    {
        "clock_events",
        "clocks",
        "thermal",
        "power",
        "ecc",
        "xid",
        "gpu_links",
        "link_errors",
        "link_flaps",
        "link_rate",
        "xmit_wait",
    }
)
TRANSIENT_ONLY = frozenset({"host_contention"})


@dataclass(frozen=True)
class Finding:
    """One flagged node and what kind of finding it is."""

    node: str
    kind: Kind
    why: str
    job: str | None = None
    detectors: tuple[str, ...] = ()
    score: float = 0.0
    impact: dict[str, Any] | None = None
    newest: float = 0.0  # end of the newest window the node was flagged in

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "kind": self.kind,
            "why": self.why,
            "job": self.job,
            "detectors": list(self.detectors),
            "score": self.score,
            "impact": self.impact,
            "newest": self.newest,
        }


@dataclass(frozen=True)
class FleetFinding:
    """A common cause: too many nodes of one job, rack or the fleet flagged at once; a heavy
    pipeline stage (scope ``stage``); or a job slower on every rank than its own history
    (scope ``slowdown``, with what it costs the job: none of its nodes is at fault)."""

    scope: Literal["job", "rack", "fleet", "stage", "slowdown"]
    name: str
    nodes: tuple[str, ...]
    of: int  # how many nodes the job / rack / fleet has
    why: str
    impact: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {
            "scope": self.scope,
            "name": self.name,
            "nodes": list(self.nodes),
            "of": self.of,
            "why": self.why,
        }
        if self.impact is not None:
            out["impact"] = self.impact
        return out


@dataclass(frozen=True)
class Classified:
    """Every flagged node's finding, the fleet-wide findings that took nodes over, and the
    fabric components at fault (:mod:`guardctl.analyze.fabric`)."""

    findings: tuple[Finding, ...]
    fleet: tuple[FleetFinding, ...] = field(default=())
    fabric: tuple[FabricFinding, ...] = field(default=())

    def of(self, node: str) -> Finding | None:
        return next((f for f in self.findings if f.node == node), None)


def membership(groups: Mapping[str, str]) -> dict[str, str]:
    """node -> group name, from ``{group: hostlist}`` (racks, device models)."""
    return {node: name for name, nodes in groups.items() for node in expand(nodes)}


def node_kind(v: NodeVerdict) -> tuple[Kind, str]:
    """A single node's kind on its own evidence (before job, rack and fleet are looked at)."""
    detectors = {e.detector for e in v.evidence}
    hardware = sorted(detectors & HARDWARE)
    if v.verdict != SUSPECT:
        return "transient", "flagged, but not in enough windows to be persistent"
    if hardware:
        return (
            "persistent",
            f"hardware signals ({', '.join(hardware)}) in {v.flagged_windows} windows",
        )
    if detectors & TRANSIENT_ONLY:
        # Someone else's load on the host explains the slow ranks: it passes with the load.
        return "transient", "host contention, no hardware signal"
    if "busy_time" in detectors:
        return "persistent", f"busy time behind its peers in {v.flagged_windows} windows"
    return "persistent", f"flagged in {v.flagged_windows} windows"


def _too_many(flagged: int, size: int, fraction: float, min_group: int) -> bool:
    """Whether *flagged* nodes of a group of *size* are a common cause, not node faults.

    ``min_group`` bounds the flagged set, not the group: two independent grey nodes are two
    node faults in a fleet of any size, and one node is never a common cause.
    """
    return flagged >= max(2, min_group) and flagged > fraction * size


def _groups(nodes: Iterable[str], key: Mapping[str, str | None]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node in nodes:
        name = key.get(node)
        if name is not None:
            out.setdefault(name, []).append(node)
    return out


def classify(
    analysis: Analysis,
    cfg: ControlSettings,
    fleet_size: int | None = None,
    topology: Topology | None = None,
    pairwise: Iterable[PairResult] = (),
) -> Classified:
    """Classify every flagged node of *analysis* (those with evidence, suspect or not).

    *fleet_size* is the number of nodes Slurm knows (the fleet the fractions are of); without
    it, the nodes the analysis saw. With the network *topology* (and any *pairwise* all-reduce
    results), the fabric components at fault are localised first: a node whose every signal
    is the network's, under a switch found at fault, is kind ``fabric`` (never a node action);
    the topology's leaves serve as racks when ``[control] racks`` is empty.
    """
    flagged = [v for v in analysis.nodes if v.evidence or v.verdict == SUSPECT]
    kinds = {v.node: node_kind(v) for v in flagged}
    fabric, by_fabric = _fabric(analysis, topology, pairwise)
    for node, (kind, why) in by_fabric.items():
        kinds[node] = (kind, why)
    faults = [n for n, (k, _) in kinds.items() if k == "persistent"]
    size = max(fleet_size or 0, len(analysis.nodes))
    racks = membership(cfg.racks) if cfg.racks else _leaf_of(topology)
    fleet = _fleet_wide(analysis, faults, cfg, size, racks)
    structural = {n: f for f in fleet for n in f.nodes}
    hetero = _heterogeneous(analysis, [n for n in faults if n not in structural], cfg)
    # A heavy stage flags none of its nodes (they are judged against their own stage): it is
    # reported, and a node fault inside that stage is still a node fault.
    fleet += [
        FleetFinding(
            "stage",
            f"{s.job}/stage{s.stage}",
            s.nodes,
            sum(1 for v in analysis.nodes if v.job == s.job),
            s.why,
        )
        for s in analysis.stages
    ]
    # A job slowed on every rank alike against its own history names no node (none of its
    # nodes was flagged where it was slower): reported with its cost, no node action.
    fleet += [
        FleetFinding("slowdown", j.job, j.nodes, len(j.nodes), j.why, j.impact)
        for j in analysis.slowed
    ]
    findings = []
    for v in flagged:
        kind, why = kinds[v.node]
        if v.node in structural:
            kind, why = "structural", structural[v.node].why
        elif v.node in hetero:
            kind, why = "heterogeneity", hetero[v.node]
        findings.append(
            Finding(
                v.node,
                kind,
                why,
                v.job,
                tuple(sorted({e.detector for e in v.evidence})),
                v.score,
                v.impact,
                max((e.window_end for e in v.evidence), default=analysis.window_end),
            )
        )
    return Classified(tuple(findings), tuple(fleet), fabric)


def _fabric(
    analysis: Analysis, topology: Topology | None, pairwise: Iterable[PairResult]
) -> tuple[tuple[FabricFinding, ...], dict[str, tuple[Kind, str]]]:
    """The fabric findings, and the flagged nodes whose every signal is the network's that a
    switch explains (node -> ("fabric", why)) or may soon (most of their leaf's nodes show
    network symptoms, no switch named yet: node -> ("transient", why), watched, not acted on).
    A node with a link finding of its own stays a node fault."""
    if topology is None:
        return (), {}
    symptoms, judged = symptoms_of(analysis)
    found = localise(topology, symptoms, judged, pairwise)
    switch = {n: f for f in found if f.kind != "link" for n in f.nodes}
    own_link = {n for f in found if f.kind == "link" for n in f.nodes}
    arriving = forming(topology, symptoms, judged)
    out: dict[str, tuple[Kind, str]] = {}
    for s in symptoms:
        if not s.signals <= NETWORK or s.node in own_link:
            continue
        f = switch.get(s.node)
        if f is not None:
            out[s.node] = (
                "fabric",
                f"{', '.join(sorted(s.signals))} explained by {f.component} "
                f"(confidence {f.confidence:.2f}): the fabric's fault, not the node's",
            )
        elif s.node in arriving:
            out[s.node] = (
                "transient",
                f"most of leaf {arriving[s.node]}'s nodes show network symptoms: a fabric "
                "fault arriving, watched until its component is named",
            )
    return found, out


def _leaf_of(topology: Topology | None) -> dict[str, str]:
    """node -> its leaf: the tree's leaves as racks (none without a tree)."""
    if topology is None:
        return {}
    return {n: leaf for leaf in topology.leaves() for n in topology.switches[leaf].nodes}


def _fleet_wide(
    analysis: Analysis,
    faults: Sequence[str],
    cfg: ControlSettings,
    fleet_size: int,
    racks: Mapping[str, str],
) -> list[FleetFinding]:
    """Jobs, racks or the fleet with more of their nodes flagged than ``[control]`` allows.

    The narrowest scope that explains the flagged nodes wins: the fleet is named only when
    they are over the fleet's fraction and no single job or rack smaller than the fleet holds
    them all.
    """
    seen = [v.node for v in analysis.nodes]
    jobs = {v.node: v.job for v in analysis.nodes}
    job_members, rack_members = _groups(seen, jobs), _groups(seen, racks)
    out = [
        f
        for j, nodes in sorted(_groups(faults, jobs).items())
        if (f := _group_finding("job", j, nodes, job_members[j], cfg)) is not None
    ]
    taken = {n for f in out for n in f.nodes}  # a job's finding keeps its nodes
    out += [
        f
        for r, nodes in sorted(_groups([n for n in faults if n not in taken], racks).items())
        if (f := _group_finding("rack", r, nodes, rack_members[r], cfg)) is not None
    ]
    if not _too_many(len(faults), fleet_size, cfg.max_fleet_fraction, cfg.min_group):
        return out
    # One job or rack smaller than the fleet holds them all: its cause, not the fleet's.
    whole = [f for f in out if len(f.nodes) == len(faults) and f.of < fleet_size]
    return whole[:1] or [
        FleetFinding(
            "fleet",
            "fleet",
            tuple(faults),
            fleet_size,
            f"{len(faults)} of {fleet_size} nodes flagged at once (over "
            f"control.max_fleet_fraction={cfg.max_fleet_fraction:g}): a fleet-wide cause, "
            "not node faults",
        )
    ]


# Each scope's fraction setting, and the common cause its finding names.
SCOPES = {
    "job": ("max_job_fraction", "the job's cause (its input, a checkpoint, its code)"),
    "rack": ("max_rack_fraction", "the rack's cause (power, cooling, its switch)"),
}


def _group_finding(
    scope: Literal["job", "rack"],
    name: str,
    nodes: list[str],
    members: list[str],
    cfg: ControlSettings,
) -> FleetFinding | None:
    """The finding of a job or rack with too many of its *members* among *nodes*, if any."""
    setting, cause = SCOPES[scope]
    if not _too_many(len(nodes), len(members), getattr(cfg, setting), cfg.min_group):
        return None
    return FleetFinding(
        scope,
        name,
        tuple(nodes),
        len(members),
        f"{len(nodes)} of {scope} {name}'s {len(members)} nodes flagged at "
        f"once: {cause}, not node faults",
    )


def _heterogeneous(
    analysis: Analysis, faults: Sequence[str], cfg: ControlSettings
) -> dict[str, str]:
    """Suspects explained by a slower device model mixed into their job."""
    if not cfg.models:
        return {}
    models = membership(cfg.models)
    verdicts = {v.node: v for v in analysis.nodes}
    out: dict[str, str] = {}
    for node in faults:
        v = verdicts[node]
        if v.job is None or node not in models or {e.detector for e in v.evidence} & HARDWARE:
            continue
        job_nodes = [n for n, w in verdicts.items() if w.job == v.job]
        same = [n for n in job_nodes if models.get(n) == models[node]]
        if len({models.get(n) for n in job_nodes}) < 2:
            continue
        slow = set(faults)
        if all(n in slow for n in same) and not any(n in slow for n in job_nodes if n not in same):
            out[node] = (
                f"every {models[node]} node of job {v.job} and no other is slower: "
                "a slower device model mixed into the job (shares, not a drain)"
            )
    return out
