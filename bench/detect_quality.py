#!/usr/bin/env python3
"""Detection benchmark: precision, recall and time to detect over many seeds and fleet sizes.

For each (fleet size, seed) it simulates a 30-minute trace with every fault
kind injected (``--faults all:K``) and every benign confounder, plus one
fault-free fleet per size, then runs the analyzer every 60 s over the trace as
a timer would (``guardctl.simulate.score``). A fault counts as detected at the
first pass that calls its node suspect after its onset; every other suspect,
in any pass, is a false positive. Time to detect is in windows (5 min).

Targets: precision and recall >= 0.98, zero false positives on clean fleets,
detection within two windows of onset.

Fabric localisation (``--fabric-seeds``, 3 by default, 2 with ``--quick``; 0 leaves it out):
per fleet size and seed, one trace per fabric fault kind (a degraded leaf, a flapping uplink,
a congested spine group, one bad cable) with one of each node fault beside it, and one with
node faults only; the controller's classification runs every 60 s with the network tree and
without it (today). Per kind: precision and recall of the component named, time to localise
(windows from onset to the first pass naming it), and the nodes behind the fault (without a
node fault of their own) that the classification would act on, without and with the tree.

``--scrape 10,30`` also judges each trace as a Prometheus source would see it: the
GPU and NIC records rendered as the series dcgm-exporter and node_exporter scraping
every 10 s / 30 s would hold, read back through the source's own mapping
(:mod:`guardctl.sources`), once with the store's step and host records ("mixed", what
``--from prometheus`` reads) and once alone ("exporter"). One table per way of reading.

    python bench/detect_quality.py            # 3 sizes x 8 seeds
    python bench/detect_quality.py --quick    # 2 sizes x 3 seeds (CI)
    python bench/detect_quality.py --quick --scrape 10,30
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from guardctl.analyze import Frame, load
from guardctl.analyze.frame import concat
from guardctl.config import Settings
from guardctl.simulate import Truth, simulate
from guardctl.simulate.faults import FABRIC
from guardctl.simulate.fleet import tree
from guardctl.simulate.score import FabricScore, Score, score_fabric, score_trace
from guardctl.sources.dcgm_fields import exporter_series
from guardctl.sources.prometheus import matrices, to_frame
from guardctl.telemetry.schema import read_path


def labels(scrapes: list[float]) -> list[str]:
    return ["store"] + [f"{way}@{s:g}s" for s in scrapes for way in ("mixed", "exporter")]


def source_frames(
    out: Path, truth: Truth, settings: Settings, scrapes: list[float]
) -> Iterator[tuple[str, Frame]]:
    """(label, frame) per way of reading one trace: the store, then per scrape interval."""
    yield "store", load(out, settings)
    if not scrapes:
        return
    records = read_path(out).records
    kept = load(out, settings)  # what --from prometheus still reads from the store
    for kind, cols in kept.cols.items():
        if kind not in settings.source.store_kinds:
            kept.cols[kind] = {name: col[:0] for name, col in cols.items()}
    for scrape in scrapes:
        series = matrices(exporter_series(records, scrape, truth.start, truth.end))
        # exact samples, no query steps: nothing stale to drop (no sample times asked)
        exported, _ = to_frame(lambda m, t, s=series: [] if t else s.get(m, []), settings.source)  # type: ignore[misc]
        yield f"mixed@{scrape:g}s", concat([exported, kept])
        yield f"exporter@{scrape:g}s", exported


def score_all(
    out: Path, truth: Truth, settings: Settings, scrapes: list[float]
) -> dict[str, Score]:
    return {
        label: score_trace(frame, truth, settings.analyze, step_s=60)
        for label, frame in source_frames(out, truth, settings, scrapes)
    }


def run(
    sizes: list[int], seeds: list[int], per_kind: int, workdir: Path, scrapes: list[float]
) -> dict[str, dict[str, object]]:
    """One result (as :func:`table` prints it) per way of reading the traces."""
    settings = Settings()
    acc = {label: _Acc() for label in labels(scrapes)}
    for nodes in sizes:
        for acc_one in acc.values():
            acc_one.begin(nodes)
        for seed in seeds:
            out = workdir / f"n{nodes}-s{seed}"
            per = per_kind if nodes >= 64 else 1
            truth = simulate(out, nodes=nodes, duration=1800, seed=seed, faults=f"all:{per}")
            for label, score in score_all(out, truth, settings, scrapes).items():
                acc[label].add(score, truth)
        clean_out = workdir / f"n{nodes}-clean"
        truth = simulate(clean_out, nodes=nodes, duration=1800, seed=10_000 + nodes, faults="none")
        for label, score in score_all(clean_out, truth, settings, scrapes).items():
            acc[label].clean(score)
            print(f"{label} {nodes} nodes: {acc[label].summary()}", file=sys.stderr)
    return {label: a.result() for label, a in acc.items()}


class _Acc:
    """Scores of one way of reading, per fleet size and per fault kind."""

    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []
        self.by_kind: dict[str, list[float]] = defaultdict(list)
        self.missed_kinds: dict[str, int] = defaultdict(int)
        self.ttd_kind: dict[str, list[float]] = defaultdict(list)

    def begin(self, nodes: int) -> None:
        self.rows.append(
            {
                "nodes": nodes,
                "traces": 0,
                "faults": 0,
                "detected": 0,
                "false_nodes": 0,
                "false_passes": 0,
                "passes": 0,
                "ttd": [],
                "clean_false": 0,
            }
        )

    def add(self, score: Score, truth: Truth) -> None:
        agg: dict[str, object] = self.rows[-1]
        agg["traces"] += 1  # type: ignore[operator]
        agg["faults"] += score.faults  # type: ignore[operator]
        agg["detected"] += score.detected  # type: ignore[operator]
        agg["false_nodes"] += len(score.false_nodes)  # type: ignore[operator]
        agg["false_passes"] += score.false_passes  # type: ignore[operator]
        agg["passes"] += score.passes  # type: ignore[operator]
        agg["ttd"] += score.ttd_windows  # type: ignore[operator]
        kinds = {i.node: i.kind for i in truth.faults}
        for node, windows in score.ttd.items():
            self.by_kind[kinds[node]].append(1.0)
            self.ttd_kind[kinds[node]].append(windows)
        for m in score.missed:
            self.missed_kinds[m.split(":")[1]] += 1
            self.by_kind[m.split(":")[1]].append(0.0)

    def clean(self, score: Score) -> None:
        self.rows[-1]["clean_false"] = len(score.false_nodes)
        self.rows[-1]["clean_passes"] = score.passes

    def summary(self) -> str:
        return json.dumps({k: v for k, v in self.rows[-1].items() if k != "ttd"})

    def result(self) -> dict[str, object]:
        return {
            "rows": self.rows,
            "by_kind": {k: float(np.mean(v)) for k, v in self.by_kind.items()},
            "ttd_kind": {
                k: (float(np.median(v)), float(np.max(v))) for k, v in self.ttd_kind.items()
            },
            "missed_kinds": dict(self.missed_kinds),
        }


def table(result: dict[str, object]) -> str:
    lines = [
        "| fleet | traces | faults | precision | recall | false positives (nodes / "
        "node-passes) | clean fleet false positives | time to detect, windows: "
        "median / p95 / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:  # type: ignore[attr-defined]
        called = r["detected"] + r["false_nodes"]
        precision = r["detected"] / called if called else 1.0
        recall = r["detected"] / r["faults"] if r["faults"] else 1.0
        ttd = np.array(r["ttd"]) if r["ttd"] else np.array([np.nan])
        lines.append(
            f"| {r['nodes']} nodes ({r['nodes'] * 8} GPUs) | {r['traces']} | {r['faults']} "
            f"| {precision:.3f} | {recall:.3f} | {r['false_nodes']} / {r['false_passes']} of "
            f"{r['passes']} passes | {r['clean_false']} in {r['clean_passes']} passes "
            f"| {np.median(ttd):.2f} / {np.percentile(ttd, 95):.2f} / {ttd.max():.2f} |"
        )
    lines += ["", "| fault | recall | time to detect, windows: median / max |", "|---|---|---|"]
    by_kind: dict[str, float] = result["by_kind"]  # type: ignore[assignment]
    ttd_kind: dict[str, tuple[float, float]] = result["ttd_kind"]  # type: ignore[assignment]
    for kind in sorted(by_kind):
        med, top = ttd_kind.get(kind, (float("nan"), float("nan")))
        lines.append(f"| {kind} | {by_kind[kind]:.3f} | {med:.2f} / {top:.2f} |")
    return "\n".join(lines)


NODE_FAULTS_ONLY = "none (node faults only)"


def fabric_run(sizes: list[int], seeds: list[int], workdir: Path) -> dict[str, dict[str, Any]]:
    """Localisation per fabric fault kind over every size and seed (see the module's text)."""
    settings = Settings()
    acc: dict[str, dict[str, Any]] = {}
    for nodes in sizes:
        for seed in seeds:
            for kind in [*FABRIC.names(), NODE_FAULTS_ONLY]:
                out = workdir / f"fabric-n{nodes}-s{seed}-{kind.split()[0]}"
                spec = "all:1" if kind == NODE_FAULTS_ONLY else f"all:1,{kind}"
                truth = simulate(out, nodes=nodes, duration=1800, seed=seed, faults=spec)
                topo = tree(truth.nodes, truth.leaf_size)
                found = score_fabric(load(out, settings), truth, settings, topo, step_s=60)
                _add_fabric(acc.setdefault(kind, _fabric_acc()), found)
                print(f"fabric {kind} {nodes} nodes seed {seed}: {_one(found)}", file=sys.stderr)
    return acc


def _fabric_acc() -> dict[str, Any]:
    return {
        "traces": 0,
        "faults": 0,
        "localised": 0,
        "wrong": 0,
        "ttl": [],
        "drains_today": 0,
        "drains_with": 0,
        "node_faults_today": 0,
        "node_faults_with": 0,
    }


def _add_fabric(acc: dict[str, Any], s: FabricScore) -> None:
    acc["traces"] += 1
    acc["faults"] += len(s.faults)
    acc["localised"] += len(s.ttl)
    acc["wrong"] += len(s.wrong)
    acc["ttl"] += [round(float(x), 3) for x in s.ttl.values()]
    acc["drains_today"] += len(s.drains_today)
    acc["drains_with"] += len(s.drains_with)
    acc["node_faults_today"] += len(s.node_faults_today)
    acc["node_faults_with"] += len(s.node_faults_with)


def _one(s: FabricScore) -> str:
    return json.dumps(
        {
            "localised": sorted(s.ttl),
            "wrong": sorted(s.wrong),
            "drains_today": len(s.drains_today),
            "drains_with": len(s.drains_with),
        }
    )


def fabric_table(acc: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| fabric fault | traces | component precision | component recall | time to localise, "
        "windows: median / max | wrong components named | nodes behind it acted on: "
        "today / with the tree (drains avoided) | injected node faults acted on: today / with "
        "the tree |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, a in acc.items():
        named = a["localised"] + a["wrong"]
        precision = f"{a['localised'] / named:.3f}" if named else "-"
        recall = f"{a['localised'] / a['faults']:.3f}" if a["faults"] else "-"
        ttl = np.array(a["ttl"]) if a["ttl"] else None
        when = f"{np.median(ttl):.2f} / {ttl.max():.2f}" if ttl is not None else "-"
        avoided = a["drains_today"] - a["drains_with"]
        lines.append(
            f"| {kind} | {a['traces']} | {precision} | {recall} | {when} | {a['wrong']} "
            f"| {a['drains_today']} / {a['drains_with']} ({avoided}) "
            f"| {a['node_faults_today']} / {a['node_faults_with']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 sizes x 3 seeds")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--scrape",
        default="",
        metavar="S[,S...]",
        help="also judge the traces as exporter series scraped every S seconds (e.g. 10,30)",
    )
    parser.add_argument("--sizes", default="", metavar="N[,N...]", help="fleet sizes, in nodes")
    parser.add_argument(
        "--fabric-seeds",
        type=int,
        default=None,
        metavar="K",
        help="seeds per size for fabric localisation (default 3, --quick 2; 0: none)",
    )
    args = parser.parse_args()
    scrapes = [float(x) for x in args.scrape.split(",") if x]
    sizes = [32, 96] if args.quick else [32, 96, 256]
    sizes = [int(x) for x in args.sizes.split(",") if x] or sizes
    seeds = list(range(1, 4)) if args.quick else list(range(1, 9))
    fabric_seeds = args.fabric_seeds if args.fabric_seeds is not None else 2 if args.quick else 3
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="guardctl-quality-") as tmp:
        results = run(sizes, seeds, per_kind=2, workdir=Path(tmp), scrapes=scrapes)
        node_seconds = time.perf_counter() - t0
        fabric = fabric_run(sizes, seeds[:fabric_seeds], Path(tmp)) if fabric_seeds else {}
    seconds = time.perf_counter() - t0
    if args.json:
        for result in results.values():
            for r in result["rows"]:  # type: ignore[attr-defined]
                r["ttd"] = [round(x, 3) for x in r["ttd"]]
        doc = {"results": results, "fabric": fabric, "seconds": seconds}
        print(json.dumps(doc, indent=1))
    else:
        for label, result in results.items():
            if len(results) > 1:
                print(f"\n### {label}\n")
            print(table(result))
        print(f"\n({node_seconds:.0f} s)")
        if fabric:
            print(f"\n{fabric_table(fabric)}\n\n({seconds - node_seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
