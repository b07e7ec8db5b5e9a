"""Parse Slurm's JSON (22.05 and newer) and text outputs into guardctl's typed objects.

Formats seen across releases, all accepted here:

* 22.05 (``sinfo --json``): ``"state": "idle"`` plus ``"state_flags": ["DRAIN"]``;
  plain integers for times.
* 23.02+ (``scontrol --json show nodes``): ``"state": ["IDLE", "DRAIN"]``.
* 23.11+ (data_parser v0.0.40+): numbers wrapped as
  ``{"set": true, "infinite": false, "number": N}``.
* 23.02+ ``sinfo --json`` groups nodes (``{"nodes": {"nodes": [...]}, "node": {"state": [...]},
  "reason": {"description", "user", "time"}}``), where ``scontrol --json`` has flat ``reason``,
  ``reason_set_by_user`` and ``reason_changed_at`` per node. 26.05's groups drop RESERVED and
  MAINTENANCE (a reserved idle node shows plain IDLE), so guardctl reads nodes from scontrol.
* 24.11 reports ``reason_set_by_user`` (``root``) on nodes that have no reason; it is ignored.
* squeue: ``"job_state": "RUNNING"`` (22.05) or ``["RUNNING"]`` (23.02+);
  ``"nodes"`` a hostlist string; ``exit_code`` an int (22.05) or
  ``{"status": [...], "return_code": N}`` (newer).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from guardctl.errors import SlurmError
from guardctl.slurm.types import JobInfo, NodeInfo, ReservationInfo
from guardctl.topology import Switch, Topology

# Base states Slurm can report; anything else in a state list is a flag.
_BASE_STATES = frozenset(
    {"idle", "allocated", "mixed", "down", "error", "future", "unknown", "completing", "fail"}
)


def load_json(text: str, what: str) -> dict[str, Any]:
    """Decode a Slurm command's JSON output, raising SlurmError with its own errors."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"{what}: output is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SlurmError(f"{what}: unexpected JSON ({type(data).__name__})")
    errors = data.get("errors") or []
    if errors:
        first = errors[0]
        if isinstance(first, dict):
            first = first.get("error") or first.get("description") or first
        raise SlurmError(f"{what}: {first}")
    return data


def number(value: Any) -> float | None:
    """A Slurm number in any release's shape; None when unset or infinite."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _time(value: Any) -> float | None:
    ts = number(value)
    return ts if ts else None  # Slurm uses 0 for "never"


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v for v in re.split(r"[,+]", value) if v]
    if isinstance(value, Sequence):
        return [str(v) for v in value if v is not None]
    return [str(value)]


def split_state(state: Any, flags: Any = None) -> tuple[str, frozenset[str]]:
    """Split any release's node state into (base state, flags)."""
    words = [w.strip() for w in _strings(state) + _strings(flags) if w.strip()]
    base = "unknown"
    extra: set[str] = set()
    for word in words:
        lower = word.lower().rstrip("*~#!%$@^-")
        if lower in _BASE_STATES and base == "unknown":
            base = lower
        else:
            extra.add(word.upper())
    # 22.05 reports "drained"/"draining" as the base state of sinfo's long form.
    if base == "unknown" and any(f in ("DRAINED", "DRAINING") for f in extra):
        extra.add("DRAIN")
    return base, frozenset(extra)


def node_from_json(raw: Mapping[str, Any]) -> NodeInfo:
    """One node object from sinfo/scontrol JSON."""
    base, flags = split_state(raw.get("state"), raw.get("state_flags"))
    reason = str(raw.get("reason") or "")
    return NodeInfo(
        name=str(raw.get("name") or raw.get("hostname") or ""),
        state=base,
        flags=flags,
        reason=reason,
        reason_user=str(raw.get("reason_set_by_user") or "") if reason else "",
        reason_time=_time(raw.get("reason_changed_at")) if reason else None,
        partitions=tuple(_strings(raw.get("partitions"))),
        cpus=int(number(raw.get("cpus")) or 0),
        gres=str(raw.get("gres") or ""),
    )


def nodes_from_json(text: str) -> list[NodeInfo]:
    """All nodes from ``sinfo --json`` (22.05's flat list or 23.02+'s groups) or
    ``scontrol --json show nodes`` (23.02+)."""
    data = load_json(text, "node list")
    raw_nodes = data.get("nodes")
    if raw_nodes is None and isinstance(data.get("sinfo"), list):
        raw_nodes = _ungroup_sinfo(data["sinfo"])
    if not isinstance(raw_nodes, list):
        raise SlurmError("node list: no 'nodes' array in Slurm's JSON")
    seen: dict[str, NodeInfo] = {}
    for raw in raw_nodes:
        if isinstance(raw, Mapping):
            node = node_from_json(raw)
            if node.name:
                seen.setdefault(node.name, node)
    return list(seen.values())


def with_flags_from_text(nodes: list[NodeInfo], text: str) -> list[NodeInfo]:
    """*nodes* with the flags that ``scontrol show -o node`` shows and their JSON does not
    (24.11 reports BLOCKED in text only). Flags are only added: the two reads are not one
    moment, and a flag too many holds a node back, a flag too few would not."""
    shown: dict[str, frozenset[str]] = {}
    for line in text.splitlines():
        kv = parse_key_values(line)
        if "NodeName" in kv and "State" in kv:
            shown[kv["NodeName"]] = split_state(kv["State"])[1]
    return [
        replace(node, flags=node.flags | shown[node.name])
        if shown.get(node.name, node.flags) - node.flags
        else node
        for node in nodes
    ]


def _ungroup_sinfo(groups: list[Any]) -> list[dict[str, Any]]:
    """23.02+ ``sinfo --json`` lists groups of nodes that share a state and reason: one flat
    node dict (scontrol's keys) per node of each group."""
    out = []
    for group in groups:
        if not isinstance(group, Mapping):
            continue
        names = (group.get("nodes") or {}).get("nodes") or []
        reason = group.get("reason") or {}
        if not isinstance(reason, Mapping):  # a plain string in some releases
            reason = {"description": reason}
        partition = group.get("partition") or {}
        per_node_cpus = (group.get("cpus") or {}).get("maximum")
        for name in names:
            out.append(
                {
                    "name": name,
                    "state": (group.get("node") or {}).get("state"),
                    "reason": reason.get("description"),
                    "reason_set_by_user": reason.get("user"),
                    "reason_changed_at": reason.get("time"),
                    "partitions": [partition.get("name")] if isinstance(partition, Mapping) else [],
                    "cpus": per_node_cpus,
                }
            )
    return out


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist (``node[1-3]``), tolerating empty and '(null)'."""
    if not text or text in ("(null)", "None"):
        return ()
    try:
        return tuple(NodeSet(text))
    except NodeSetParseError:
        return tuple(t for t in text.split(",") if t)


def _exit_code(value: Any) -> int | None:
    if isinstance(value, Mapping):
        rc = value.get("return_code")
        return int(number(rc) or 0) if rc is not None else None
    num = number(value)
    if num is None:
        return None
    # 22.05 reports the raw wait status: the exit code is the high byte.
    return int(num) >> 8 if num > 255 else int(num)


def job_from_json(raw: Mapping[str, Any]) -> JobInfo:
    """One job object from ``squeue --json``."""
    states = _strings(raw.get("job_state"))
    nodes_field = raw.get("nodes")
    if isinstance(nodes_field, Mapping):  # not seen yet, but cheap to accept
        nodes_field = nodes_field.get("nodes", "")
    return JobInfo(
        job_id=int(number(raw.get("job_id")) or 0),
        name=str(raw.get("name") or ""),
        user=str(raw.get("user_name") or raw.get("user") or ""),
        state=(states[0] if states else "UNKNOWN").upper(),
        nodes=expand_hostlist(str(nodes_field or "")),
        reservation=str(raw.get("resv_name") or raw.get("reservation") or ""),
        partition=str(raw.get("partition") or ""),
        exit_code=_exit_code(raw.get("exit_code")),
        reason=str(raw.get("state_reason") or ""),
        submit_time=_time(raw.get("submit_time")),
        start_time=_time(raw.get("start_time")),
        end_time=_time(raw.get("end_time")),
        requeue=raw.get("requeue") is True,
        excluded=expand_hostlist(str(raw.get("excluded_nodes") or "")),
    )


def jobs_from_json(text: str) -> list[JobInfo]:
    data = load_json(text, "job list")
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list):
        raise SlurmError("job list: no 'jobs' array in Slurm's JSON")
    return [job_from_json(j) for j in raw_jobs if isinstance(j, Mapping)]


def _slurm_time(text: str) -> float | None:
    # scontrol prints local times like 2026-11-30T12:47:01, or "Unknown"/"None".
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


_KEY_VALUE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:]*=|$)")


def parse_key_values(line: str) -> dict[str, str]:
    """Parse one ``scontrol show -o`` line of ``Key=Value`` words."""
    out: dict[str, str] = {}
    # A value runs until the next " Key=" word; values such as TRES=cpu=2 keep their '='.
    for match in _KEY_VALUE.finditer(line.strip()):
        out[match.group(1)] = match.group(2).strip()
    return out


def reservations_from_text(text: str) -> list[ReservationInfo]:
    """All reservations from ``scontrol show -o reservation`` (22.05 has no JSON for them)."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No reservations"):
            continue
        kv = parse_key_values(line)
        if "ReservationName" not in kv:
            continue
        out.append(
            ReservationInfo(
                name=kv["ReservationName"],
                nodes=expand_hostlist(kv.get("Nodes", "")),
                users=tuple(u for u in kv.get("Users", "").split(",") if u and u != "(null)"),
                flags=frozenset(f.upper() for f in kv.get("Flags", "").split(",") if f),
                start_time=_slurm_time(kv.get("StartTime", "")),
                end_time=_slurm_time(kv.get("EndTime", "")),
                state=kv.get("State", ""),
            )
        )
    return out


def reservations_from_json(text: str) -> list[ReservationInfo]:
    """All reservations from ``scontrol --json show reservations`` (23.02+)."""
    data = load_json(text, "reservation list")
    out = []
    for raw in data.get("reservations") or []:
        if not isinstance(raw, Mapping):
            continue
        users = raw.get("users", "")
        out.append(
            ReservationInfo(
                name=str(raw.get("name") or ""),
                nodes=expand_hostlist(str(raw.get("node_list") or "")),
                users=tuple(_strings(users)),
                flags=frozenset(f.upper() for f in _strings(raw.get("flags"))),
                start_time=_time(raw.get("start_time")),
                end_time=_time(raw.get("end_time")),
            )
        )
    return out


def version_from_text(text: str) -> tuple[int, int]:
    """``slurm 22.05.8`` -> (22, 5)."""
    match = re.search(r"(\d+)\.(\d+)", text)
    if not match:
        raise SlurmError(f"cannot tell Slurm's version from {text.strip()!r}")
    return int(match.group(1)), int(match.group(2))


# What ``scontrol show topology`` says when no topology plugin is configured (22.05, on stderr;
# 24.11 and newer print nothing).
NO_TOPOLOGY = "no topology information available"


def topology_from_text(text: str) -> Topology | None:
    """The tree ``scontrol show topology`` prints; None when it prints none.

    topology/tree (every release): ``SwitchName=s1 Level=0 ... Nodes=node[1-2]`` for a leaf,
    ``SwitchName=s0 Level=1 ... Nodes=<every node beneath> Switches=s[1-2]`` above it.
    topology/block (23.11+): ``BlockName=b1 ... Nodes=node[1-2]`` per block and
    ``AggregatedBlock=b[1-2] ... Nodes=...`` per aggregation of BlockSizes; each block is a
    leaf, each aggregation a switch above the largest smaller ones it holds, and the blocks no
    aggregation holds hang from one root named ``fabric``.
    """
    lines = [parse_key_values(line) for line in text.splitlines() if "=" in line]
    switches = [kv for kv in lines if "SwitchName" in kv]
    blocks = [kv for kv in lines if "BlockName" in kv or "AggregatedBlock" in kv]
    if switches:
        return _tree(switches)
    if blocks:
        return _blocks(blocks)
    return None


def _tree(lines: list[dict[str, str]]) -> Topology:
    children = {kv["SwitchName"]: expand_hostlist(kv.get("Switches", "")) for kv in lines}
    beneath = {kv["SwitchName"]: set(expand_hostlist(kv.get("Nodes", ""))) for kv in lines}
    out: dict[str, Switch] = {}
    for name, below in children.items():
        # A switch above others lists every node beneath it: only those no child holds hang
        # from it directly.
        held = set().union(*(beneath.get(child, set()) for child in below))
        out[name] = Switch(name, tuple(sorted(beneath[name] - held)), tuple(sorted(below)))
    return Topology(out, "slurm")


def _blocks(lines: list[dict[str, str]]) -> Topology:
    groups = []  # (size, name, nodes, is an aggregation)
    for kv in lines:
        name = kv.get("BlockName") or kv["AggregatedBlock"]
        nodes = frozenset(expand_hostlist(kv.get("Nodes", "")))
        groups.append((len(nodes), name, nodes, "BlockName" not in kv))
    groups.sort(key=lambda g: (g[0], g[1]))
    parent: dict[str, str] = {}
    for i, (_, name, nodes, _agg) in enumerate(groups):
        above = next((g for g in groups[i + 1 :] if g[3] and nodes < g[2]), None)
        parent[name] = above[1] if above else "fabric"
    out = {
        name: Switch(
            name,
            tuple(sorted(nodes)) if not agg else (),
            tuple(sorted(c for c, p in parent.items() if p == name)),
        )
        for _, name, nodes, agg in groups
    }
    out["fabric"] = Switch(
        "fabric", (), tuple(sorted(c for c, p in parent.items() if p == "fabric"))
    )
    return Topology(out, "slurm")
