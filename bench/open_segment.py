#!/usr/bin/env python3
"""Open-segment form benchmark: what the node agent appends and the analyzer tails.

A segment's file is open while its span lasts: the agent appends every record kind of its
node (its ranks' steps included) every cadence, and the controller's analyzer reads what was
appended since its last pass. This benchmark compares the forms that file can take, on a
simulated fleet whose ranks hand their steps to the agent (``guardctl simulate --handoff``:
one file per node and segment), replayed as the agents append it (one batch per node per
10-second cadence):

- ``jsonl``: JSON Lines alone (what every JSON reader reads; guardctl's agent's lines);
- ``jsonl+cols``: JSON Lines and guardctl's own column mirror beside each file (today);
- ``ipc``: an Apache Arrow IPC stream per file (one schema, every kind's fields, null where a
  kind has none; a record batch per append), uncompressed and lz4 (pyarrow).

Agent side, per candidate (a fresh process each): CPU microseconds per append (building the
batch from the records and writing it; the fsync every candidate shares is left out), the
bytes written per record, and the resident memory of a process that imported the writer and
appended a node's batches (what each candidate adds to the agent).

Analyzer side, per candidate (a fresh process each, files in the page cache): seconds to read
every node's file into columns, and its peak memory: ``jsonl`` by guardctl's parser and by
pyarrow's JSON reader, ``jsonl+cols`` from the mirrors (guardctl's reader), ``ipc`` by
pyarrow's stream reader. Every read is checked to hold the records written, per kind.
Ratios are against merely reading the JSON Lines' bytes (``bytes``) in the same run.

    python bench/open_segment.py               # 10k GPUs, 2 minutes
    python bench/open_segment.py --quick       # 1k GPUs
    python bench/open_segment.py --gpus 30000 --minutes 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

CADENCE_S = 10.0
WRITERS = ("jsonl", "jsonl+cols", "ipc", "ipc-lz4")
READERS = ("bytes", "jsonl", "pyarrow-json", "jsonl+cols", "ipc", "ipc-lz4")


def _wide_schema() -> Any:
    """Every kind's fields in one Arrow schema (a field two kinds share has one type)."""
    import pyarrow as pa

    from guardctl.telemetry.schema import FIELDS

    types = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}
    fields: dict[str, Any] = {"kind": pa.string(), "ts": pa.float64(), "node": pa.string()}
    for spec in FIELDS.values():
        for name, allowed in spec.items():
            fields.setdefault(name, types[float] if float in allowed else types[allowed[0]])
    return pa.schema(list(fields.items()))


def batches(store: Path) -> dict[str, list[list[bytes]]]:
    """Per node file (store-relative): its lines grouped by the cadence that appends them."""
    out: dict[str, list[list[bytes]]] = {}
    for path in sorted(store.rglob("*.jsonl")):
        by_cadence: dict[int, list[bytes]] = {}
        for line in path.read_bytes().splitlines(keepends=True):
            ts = json.loads(line)["ts"]
            by_cadence.setdefault(int(ts // CADENCE_S), []).append(line)
        out[os.fspath(path.relative_to(store))] = [by_cadence[k] for k in sorted(by_cadence)]
    return out


def write(candidate: str, plan: Path, out: Path, nodes: int = 0) -> dict[str, Any]:
    """Replay every node's appends (the first *nodes* only, if given) in *candidate*'s form
    under *out*; CPU per append."""
    appends: dict[str, list[list[str]]] = json.loads(plan.read_text())
    if nodes:
        appends = dict(list(appends.items())[:nodes])
    todo = {
        rel: [([ln.encode() for ln in b], [json.loads(ln) for ln in b]) for b in bs]
        for rel, bs in appends.items()
    }
    if candidate.startswith("ipc"):
        append, close = _ipc_writer(candidate)
    else:
        append, close = _line_writer(candidate == "jsonl+cols")
    cpu, n = 0.0, 0
    rounds = max(len(bs) for bs in todo.values())
    for k in range(rounds):  # cadence by cadence, every node's batch, as the agents append
        for rel, bs in todo.items():
            if k < len(bs):
                t0 = time.process_time()
                append(out / rel, *bs[k])
                cpu += time.process_time() - t0
                n += 1
    close()
    return {
        "appends": n,
        "cpu_us_per_append": cpu / n * 1e6,
        "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        "rss_mib": _rss_mib(),
    }


def _line_writer(mirrored: bool) -> tuple[Any, Any]:
    from guardctl.storage.writer import LineWriter
    from guardctl.telemetry.mirror import Mirror
    from guardctl.telemetry.schema import dumps

    writer = LineWriter(fsync=lambda fd: None, mirror=Mirror(fsync=False) if mirrored else None)

    def append(path: Path, lines: list[bytes], records: list[dict[str, Any]]) -> None:
        # the agent's own records made into lines; its ranks' steps arrive as lines
        data = b"".join(
            line if r["kind"] == "step" else dumps(r).encode() + b"\n"
            for line, r in zip(lines, records, strict=True)
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        writer.append(path, data)

    return append, writer.close


def _ipc_writer(candidate: str) -> tuple[Any, Any]:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    schema = _wide_schema()
    options = ipc.IpcWriteOptions(compression="lz4" if candidate == "ipc-lz4" else None)
    open_files: dict[Path, tuple[Any, Any]] = {}

    def append(path: Path, lines: list[bytes], records: list[dict[str, Any]]) -> None:
        # the agent's own records as they are; its ranks' steps arrive as lines to parse
        rows = [
            json.loads(line) if r["kind"] == "step" else r
            for line, r in zip(lines, records, strict=True)
        ]
        if path not in open_files:
            path.parent.mkdir(parents=True, exist_ok=True)
            sink = pa.OSFile(os.fspath(path), "wb")
            open_files[path] = (sink, ipc.new_stream(sink, schema, options=options))
        sink, stream = open_files[path]
        stream.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
        sink.flush()

    def close() -> None:
        for sink, stream in open_files.values():
            stream.close()
            sink.close()

    return append, close


def read(candidate: str, store: Path) -> dict[str, Any]:
    """Read every file of *store* in *candidate*'s form; records per kind, time, memory."""
    files = sorted(os.fspath(p) for p in store.rglob("*") if p.is_file() and p.suffix != ".cols")
    if candidate in ("jsonl", "jsonl+cols"):
        from guardctl.analyze.load import read_frame
    elif candidate.startswith("ipc") or candidate == "pyarrow-json":
        import pyarrow.compute
        import pyarrow.ipc
        import pyarrow.json

        del pyarrow  # (loaded before the clock starts, as a reader's daemon has them)
    t0 = time.perf_counter()
    if candidate == "bytes":
        kinds = Counter({"bytes": sum(len(Path(f).read_bytes()) for f in files)})
    elif candidate in ("jsonl", "jsonl+cols"):
        frame = read_frame(store, column_files=candidate == "jsonl+cols", closed_segments=False)
        kinds = Counter({k: frame.count(k) for k in frame.cols if frame.count(k)})
    else:
        kinds = _read_arrow(files, candidate)
    return {"seconds": time.perf_counter() - t0, "peak_mib": _rss_mib(), "kinds": dict(kinds)}


def _read_arrow(files: list[str], candidate: str) -> Counter[str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.ipc as ipc
    import pyarrow.json as pj

    if candidate == "pyarrow-json":
        schema = _wide_schema()
        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        tables = [pj.read_json(f, parse_options=options) for f in files]
    else:
        tables = [ipc.open_stream(f).read_all() for f in files]
    table = pa.concat_tables(tables).combine_chunks()
    kinds: Counter[str] = Counter()
    for kind in pc.unique(table["kind"]).to_pylist():
        part = table.filter(pc.equal(table["kind"], kind))  # each kind's columns, as numpy
        for name in part.column_names:
            if part[name].null_count < len(part):
                part[name].to_numpy()
        kinds[kind] = len(part)
    return kinds


def _rss_mib() -> float:
    """This process's peak resident memory (VmHWM: ru_maxrss keeps the parent's across exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"open_segment: {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def bench(gpus: int, minutes: int, workdir: Path, progress: Any) -> dict[str, Any]:
    from guardctl.simulate import simulate

    source = workdir / "simulated"
    progress(f"simulating {gpus} GPUs, {minutes} minutes, ranks handing steps to the agent")
    simulate(
        source,
        nodes=max(gpus // 8, 1),
        duration=60.0 * minutes,
        faults="none",
        handoff=True,
        segment_minutes=10,
        column_files=False,
    )
    plan = workdir / "plan.json"
    appends = batches(source)
    plan.write_text(
        json.dumps({rel: [[ln.decode() for ln in b] for b in bs] for rel, bs in appends.items()})
    )
    out: dict[str, Any] = {"gpus": gpus, "minutes": minutes, "write": {}, "read": {}}
    one = workdir / "one-node.json"  # what one agent holds: its own node's batches
    one.write_text(json.dumps(dict([next(iter(json.loads(plan.read_text()).items()))])))
    for candidate in WRITERS:
        progress(f"agent side: {candidate}")
        out["write"][candidate] = child(["write", candidate, str(plan), str(workdir / candidate)])
        alone = child(["write", candidate, str(one), str(workdir / f"one-{candidate}")])
        out["write"][candidate]["agent_rss_mib"] = alone["rss_mib"]
    records = sum(len(b) for bs in appends.values() for b in bs)
    for row in out["write"].values():
        row["bytes_per_record"] = row["bytes"] / records
    where = {"bytes": "jsonl", "pyarrow-json": "jsonl"}
    for candidate in READERS:
        progress(f"analyzer side: {candidate}")
        store = workdir / where.get(candidate, candidate)
        out["read"][candidate] = child(["read", candidate, str(store)])
    counted = {c: r["kinds"] for c, r in out["read"].items() if c != "bytes"}
    if len({json.dumps(k, sort_keys=True) for k in counted.values()}) != 1:
        raise SystemExit(f"open_segment: the readers disagree on the records: {counted}")
    out["records"] = records
    return out


def table(result: dict[str, Any]) -> str:
    rows = [
        f"{result['gpus']} GPUs, {result['minutes']} minutes, {result['records']} records",
        "",
        "| agent writes | CPU per append | bytes per record | a writing process's RSS |",
        "|---|---|---|---|",
    ]
    for name, r in result["write"].items():
        rows.append(
            f"| {name} | {r['cpu_us_per_append']:.0f} us | {r['bytes_per_record']:.0f} |"
            f" {r['agent_rss_mib']:.0f} MiB |"
        )
    base = result["read"]["bytes"]["seconds"]
    rows += ["", "| analyzer reads | seconds | x bytes | peak memory |", "|---|---|---|---|"]
    for name, r in result["read"].items():
        rows.append(
            f"| {name} | {r['seconds']:.2f} | {r['seconds'] / base:.1f} | {r['peak_mib']:.0f} MiB |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1k GPUs")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        step, candidate, *paths = args.child
        if step == "write":
            result = write(candidate, Path(paths[0]), Path(paths[1]))
        else:
            result = read(candidate, Path(paths[0]))
        print(json.dumps(result))
        return 0
    gpus = 1_000 if args.quick else args.gpus
    workdir = Path(tempfile.mkdtemp(prefix="open-segment-"))
    try:
        result = bench(gpus, args.minutes, workdir, lambda s: print(s, file=sys.stderr))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
