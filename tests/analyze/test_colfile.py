"""Column mirrors: the same records as the JSON Lines they mirror, or none at all.

Every case compares what the analyzer reads through the mirrors with what it
reads parsing the JSON Lines alone (``column_files = false``), which is the
truth: a mirror that is behind, torn, damaged, stale or foreign may make a
pass slower, never different.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_fast_paths import _corrupt, _good_records

from guardctl.analyze import analyze, mirrors
from guardctl.analyze.frame import Frame
from guardctl.analyze.load import read_frame
from guardctl.config import load_settings
from guardctl.simulate import simulate
from guardctl.storage import store
from guardctl.storage.writer import LineWriter
from guardctl.telemetry import mirror as mirror_format
from guardctl.telemetry import schema
from guardctl.telemetry.columns import LAYOUT, Layout
from guardctl.telemetry.mirror import Encoder

T0 = 1_764_547_200.0


def _canonical(frame: Frame) -> dict[str, list[tuple[object, ...]]]:
    """Every record as a tuple of values, sorted: the same whatever the file order."""
    return {kind: sorted(rows, key=repr) for kind, rows in mirrors.records(frame).items()}


def _read(root: Path, mirrors: bool) -> Frame:
    return read_frame(root, column_files=mirrors)


def _same_as_parsed(root: Path) -> Frame:
    mirrored, parsed = _read(root, True), _read(root, False)
    assert _canonical(mirrored) == _canonical(parsed)
    assert (mirrored.lines, dict(mirrored.bad)) == (parsed.lines, dict(parsed.bad))
    assert mirrored.files == parsed.files
    return mirrored


def _gpu_line(node: str, ts: float, gpu: int, clock: int = 1980) -> str:
    rec = schema.make_record(
        "gpu",
        node,
        ts,
        gpu=gpu,
        sm_clock_mhz=clock,
        power_w=600.5,
        power_limit_w=700.0,
        temp_c=65.0,
        util_pct=99,
        clock_event_reasons=0,
        ecc_sbe_volatile=0,
        ecc_dbe_volatile=0,
        pcie_replay=0,
        nvlink_crc_errors=0,
        xid=None,
    )
    return schema.dumps(rec)


def _nic_line(node: str, ts: float, port: int) -> str:
    rec = schema.make_record(
        "nic",
        node,
        ts,
        device="mlx5_0",
        port=port,
        state="ACTIVE",
        rate_gbps=400.0,
        symbol_errors=0,
        link_error_recovery=0,
        link_downed=0,
        rcv_errors=0,
        xmit_wait=10 * port,
        xmit_bytes=2**40 + port,
    )
    return schema.dumps(rec)


def _step_line(node: str, ts: float, step: int, job: str = "4242") -> str:
    rec = schema.make_record(
        "step", node, ts, job=job, rank=3, step=step, step_s=1.5, compute_s=1.2, comm_s=0.3
    )
    return schema.dumps(rec)


def _sample(node: str, ts: float) -> bytes:
    lines = [_gpu_line(node, ts, g) for g in range(8)] + [_nic_line(node, ts, p) for p in (1, 2)]
    return ("\n".join(lines) + "\n").encode()


def _agent_file(root: Path, node: str = "gn01") -> Path:
    return root / "telemetry" / node / "20251201T00.jsonl"


def _write_samples(writer: LineWriter, path: Path, node: str, count: int, t0: float = T0) -> None:
    for i in range(count):
        writer.append(path, _sample(node, t0 + 10 * i))


def _agent_writes(path: Path, node: str, count: int, t0: float = T0) -> None:
    """*count* samples written as the agent writes them: each batch mirrored."""
    writer = LineWriter(mirror=mirror_format.Mirror())
    _write_samples(writer, path, node, count, t0)
    writer.close()


def _found(path: Path) -> mirrors.Mirrored:
    """What the mirror of *path* holds, as the analyzer reads it."""
    st = path.stat()
    return mirrors.read_many([str(path)], [st.st_size], [st.st_ino])


def test_simulated_fleet_analyses_the_same_with_and_without_mirrors(tmp_path: Path) -> None:
    root = tmp_path / "sim"
    simulate(root, nodes=48, duration=900.0, seed=5, faults="all:1")
    assert list(root.rglob("*.cols"))
    _same_as_parsed(root)
    plain = load_settings(assignments=["analyze.column_files=false"], environ={})
    assert analyze(root, load_settings(environ={})).to_dict() == analyze(root, plain).to_dict()


def test_string_rows_whose_hashes_collide_are_still_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sim"
    simulate(root, nodes=32, duration=300.0, seed=3, faults="all:1")
    hashed = _canonical(_same_as_parsed(root))
    # Every text of one table and length now hashes alike: the rows must be compared whole.
    monkeypatch.setattr(mirrors, "_MIX", mirrors._MIX * 0)
    words = np.array([[0, 1, 2], [0, 1, 3], [0, 1, 2]], np.uint64)
    first, inverse = mirrors._distinct(words, np.zeros(3, np.uint8), np.full(3, 5, np.uint16))
    assert sorted(first.tolist()) == [0, 1] and inverse[0] == inverse[2] != inverse[1]
    assert _canonical(_same_as_parsed(root)) == hashed


def _exact(frame: Frame) -> tuple[object, ...]:
    """Everything a frame holds, in its own order: tables, columns and input counts."""
    tables = tuple(tuple(getattr(frame, t)) for t in ("nodes", "jobs", "ports", "states"))
    cols = {k: {n: c.tolist() for n, c in cs.items()} for k, cs in frame.cols.items()}
    return tables, cols, frame.files, frame.lines, dict(frame.bad)


def test_mirrors_read_a_few_at_a_time_make_the_frame_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sim"
    simulate(root, nodes=24, duration=600.0, seed=7, faults="all:1")
    damaged = Path(mirror_format.mirror_path(sorted(root.rglob("*.jsonl"))[5]))
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x24  # one mirror among the others not usable: its file is parsed
    damaged.write_bytes(bytes(data))
    whole = _read(root, True)
    monkeypatch.setattr(mirrors, "CHUNK_BYTES", 3 * mirror_format.WIDTH * 100)
    pieces = _read(root, True)
    files = len(list(root.rglob("*.jsonl")))
    assert whole.files == files and whole.records > 20_000
    assert _exact(pieces) == _exact(whole)
    assert _canonical(pieces) == _canonical(_read(root, False))


def test_writer_keeps_the_mirror_in_step_batch_by_batch(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    _agent_writes(path, "gn01", 5)
    found = _found(path)
    assert found.usable == [True] and found.covered == [path.stat().st_size]
    assert found.frame.count("gpu") == 40 and found.frame.count("nic") == 10
    frame = _same_as_parsed(tmp_path)
    assert frame.nodes == ["gn01"] and frame.ports == ["mlx5_0:1", "mlx5_0:2"]


def test_lines_written_without_the_mirror_are_parsed_then_caught_up(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    _agent_writes(path, "gn01", 3)
    with path.open("ab") as fh:  # an agent killed between its two writes
        fh.write(_sample("gn01", T0 + 30))
    found = _found(path)
    assert found.usable == [True] and 0 < found.covered[0] < path.stat().st_size
    _same_as_parsed(tmp_path)
    _agent_writes(path, "gn01", 1, T0 + 40)  # restarted: the gap is mirrored first
    assert _found(path).covered == [path.stat().st_size]
    assert _same_as_parsed(tmp_path).count("gpu") == 40


def test_torn_mirror_is_cut_back_and_never_read(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    _agent_writes(path, "gn01", 2)
    cols = Path(mirror_format.mirror_path(path))
    whole = cols.read_bytes()
    with cols.open("ab") as fh:  # a batch cut short: rows without their mark, half a row
        fh.write(whole[mirror_format.PREAMBLE_SIZE : mirror_format.PREAMBLE_SIZE + 250])
    _same_as_parsed(tmp_path)
    _agent_writes(path, "gn01", 1, T0 + 20)
    assert cols.stat().st_size > len(whole)
    assert (cols.stat().st_size - mirror_format.PREAMBLE_SIZE) % mirror_format.WIDTH == 0
    assert _same_as_parsed(tmp_path).count("gpu") == 24


@pytest.mark.parametrize("at", [0, 30, 200, 1000, -20])
def test_damaged_byte_in_a_mirror_costs_speed_not_truth(tmp_path: Path, at: int) -> None:
    path = _agent_file(tmp_path)
    _agent_writes(path, "gn01", 3)
    cols = Path(mirror_format.mirror_path(path))
    data = bytearray(cols.read_bytes())
    data[at] ^= 0x24
    cols.write_bytes(bytes(data))
    _same_as_parsed(tmp_path)


def test_mirror_of_a_replaced_or_shortened_file_is_ignored(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    _agent_writes(path, "gn01", 3)
    cols = Path(mirror_format.mirror_path(path))
    kept = cols.read_bytes()
    lines = path.read_bytes().splitlines(keepends=True)
    os.truncate(path, sum(map(len, lines[:15])))  # cut in place, same inode: mirror is ahead
    assert _found(path).usable == [False]
    _same_as_parsed(tmp_path)
    replacement = path.with_suffix(".new")
    replacement.write_bytes(b"".join(lines))  # an edited copy put in place: another inode
    os.replace(replacement, path)
    cols.write_bytes(kept)
    assert _found(path).usable == [False]
    assert _same_as_parsed(tmp_path).count("gpu") == 24


def test_rejected_line_stops_the_mirror_and_the_rest_is_parsed(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    writer = LineWriter(mirror=mirror_format.Mirror())
    _write_samples(writer, path, "gn01", 2)
    writer.append(path, b'{"v":1,"kind":"gpu","ts":-5,"node":"gn01"}\n' + _sample("gn01", T0 + 20))
    _write_samples(writer, path, "gn01", 2, T0 + 30)
    writer.close()
    found = _found(path)
    assert found.usable == [True] and 0 < found.covered[0] < path.stat().st_size
    frame = _same_as_parsed(tmp_path)
    assert sum(frame.bad.values()) == 1 and frame.count("gpu") == 40


def test_long_names_span_several_rows(tmp_path: Path) -> None:
    node = "n" * 64  # the longest node name
    path = tmp_path / "steps" / "4242" / f"{node}.r3.20251201T00.jsonl"
    writer = LineWriter(mirror=mirror_format.Mirror())
    for i in range(4):
        job = "4242_" + "7" * 250 if i == 2 else "4242"  # a string over several rows
        writer.append(path, (_step_line(node, T0 + i, i, job) + "\n").encode())
    writer.close()
    found = _found(path)
    assert found.usable == [True] and found.covered == [path.stat().st_size]
    frame = _same_as_parsed(tmp_path)
    assert frame.nodes == [node] and len(frame.jobs) == 2


def test_foreign_files_and_missing_mirrors_mix(tmp_path: Path) -> None:
    writer = LineWriter(mirror=mirror_format.Mirror())
    for n in range(3):
        _write_samples(writer, _agent_file(tmp_path, f"gn0{n}"), f"gn0{n}", 2)
    writer.close()
    Path(mirror_format.mirror_path(_agent_file(tmp_path, "gn01"))).unlink()
    Path(mirror_format.mirror_path(_agent_file(tmp_path, "gn02"))).write_bytes(b"not a mirror")
    assert _same_as_parsed(tmp_path).nodes.__len__() == 3


def test_failing_mirror_never_fails_the_write(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    cols = Path(mirror_format.mirror_path(path))
    cols.parent.mkdir(parents=True)
    cols.mkdir()  # cannot be opened as a file
    _agent_writes(path, "gn01", 2)
    assert len(path.read_bytes().splitlines()) == 20
    assert _read(tmp_path, True).count("gpu") == 16


def test_store_check_verifies_mirrors_against_their_files(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    _agent_writes(path, "gn01", 3)
    with path.open("ab") as fh:  # lines no mirror holds yet
        fh.write(_sample("gn01", T0 + 30))
    other = _agent_file(tmp_path, "gn02")
    _write_samples(LineWriter(), other, "gn02", 1)
    report = store.check(tmp_path)
    assert report.mirrors == {"partial": 1, "none": 1} and not report.mirror_differs
    data = bytearray(path.read_bytes())  # edited in place: same size, same inode
    at = data.index(b'"sm_clock_mhz":1980')
    data[at + 15 : at + 19] = b"1410"
    with path.open("r+b") as fh:
        fh.write(data)
    report = store.check(tmp_path)
    assert report.mirror_differs == [str(path)]
    proc = subprocess.run(
        [sys.executable, "-m", "guardctl", "store", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and f"mirror differs from its file: {path}" in proc.stdout


def test_mirror_with_no_rows_yet(tmp_path: Path) -> None:
    """A preamble alone (a torn first batch cut back): nothing mirrored, the file parsed."""
    path = _agent_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(_sample("gn01", T0))
    st = path.stat()
    preamble = mirror_format.preamble(st.st_ino)
    Path(mirror_format.mirror_path(path)).write_bytes(preamble + b"\x01" * 50)
    found = mirrors.read_many([str(path)], [st.st_size], [st.st_ino])
    assert found.usable == [True] and found.covered == [0] and found.frame.records == 0
    assert _same_as_parsed(tmp_path).count("gpu") == 8
    assert mirrors.verify(path) == "partial"
    mirror = mirror_format.Mirror()
    mirror.sync(path)
    mirror.close()
    assert mirrors.verify(path) == "whole"


_EDITS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "cut", "repeat", "zero"]),
        st.integers(0, 10_000),
        st.integers(1, 255),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edits=_EDITS)
# Damage past a batch's mark breaks the chain at the next one, and a flipped bit in that mark's
# own lines slot was trusted (checksums covered only the rows before a mark: format 2).
@example(edits=[("flip", 8856, 161), ("zero", 4912, 195), ("flip", 3744, 131)])
def test_any_damage_to_a_mirror_leaves_the_records_those_of_the_file(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[str, int, int]]
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    path = _agent_file(root)
    _agent_writes(path, "gn01", 4)
    cols = Path(mirror_format.mirror_path(path))
    data = bytearray(cols.read_bytes())
    for edit, at, value in edits:
        at %= max(len(data), 1)
        if edit == "flip" and data:
            data[at] ^= value
        elif edit == "cut":
            del data[at:]
        elif edit == "repeat":  # a batch or part of one written twice
            data[at:at] = data[at : at + value * 8]
        elif edit == "zero":  # a crash of the machine: a zeroed tail
            data[at : at + value * 8] = bytes(len(data[at : at + value * 8]))
    cols.write_bytes(bytes(data))
    _same_as_parsed(root)
    assert mirrors.verify(path) in ("whole", "partial", "ignored")


@pytest.mark.parametrize("slot", [0, 1, 2])  # start, end, lines
def test_a_damaged_mark_is_not_trusted_even_as_the_last(tmp_path: Path, slot: int) -> None:
    """A flipped bit in the last mark's own start, end or line count fails its checksum:
    its batch is parsed (the chain alone catches a changed end only at a later mark)."""
    path = _agent_file(tmp_path)
    _agent_writes(path, "gn01", 4)
    cols = Path(mirror_format.mirror_path(path))
    data = bytearray(cols.read_bytes())
    width, head = mirror_format.WIDTH, mirror_format.HEAD.size
    rows = range(mirror_format.PREAMBLE_SIZE, len(data), width)
    last = max(r for r in rows if data[r] == mirror_format.MARK)
    data[last + head + 8 * slot] ^= 1
    cols.write_bytes(bytes(data))
    _same_as_parsed(tmp_path)
    assert _found(path).covered[0] < path.stat().st_size, "the damaged batch is parsed"


def _swapped_layout() -> Layout:
    """The schema's layout with two GPU fields of the same type in each other's place."""
    fields = {kind: dict(spec) for kind, spec in schema.FIELDS.items()}
    names = list(fields["gpu"])
    a, b = names.index("power_w"), names.index("temp_c")
    names[a], names[b] = names[b], names[a]
    fields["gpu"] = {name: schema.FIELDS["gpu"][name] for name in names}
    return Layout.of(fields)


def test_mirror_of_another_column_layout_is_ignored_never_misread(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    path.parent.mkdir(parents=True)
    data = _sample("gn01", T0) + _sample("gn01", T0 + 10)
    path.write_bytes(data)
    other = _swapped_layout()
    assert other.fingerprint != LAYOUT.fingerprint
    rows = Encoder(other).encode(data.splitlines(), 0, len(data))
    assert rows is not None
    cols = Path(mirror_format.mirror_path(path))
    ino = path.stat().st_ino
    # Control: the same rows under this layout's fingerprint are read, and read wrong
    # (power and temperature swapped): what the fingerprint is there to prevent.
    cols.write_bytes(mirror_format.preamble(ino) + rows)
    assert _found(path).usable == [True] and mirrors.verify(path) == "differs"
    cols.write_bytes(mirror_format.preamble(ino, other) + rows)
    assert _found(path).usable == [False] and mirrors.verify(path) == "ignored"
    frame = _same_as_parsed(tmp_path)
    assert set(frame.cols["gpu"]["power_w"].tolist()) == {600.5}
    writer = LineWriter(mirror=mirror_format.Mirror())  # the next writer rebuilds it
    writer.append(path, _sample("gn01", T0 + 20))
    writer.close()
    assert mirrors.verify(path) == "whole"
    assert _same_as_parsed(tmp_path).count("gpu") == 24


def test_mirror_of_the_first_format_is_ignored_then_rebuilt(tmp_path: Path) -> None:
    """A mirror written by the first release (no fingerprint in its preamble)."""
    old = Path(__file__).parent.parent / "fixtures" / "mirrors" / "v1"
    path = tmp_path / "telemetry" / "gn01" / "20251201T00.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes((old / "gn01.20251201T00.jsonl").read_bytes())
    data = bytearray((old / "gn01.20251201T00.cols").read_bytes())
    data[16:24] = path.stat().st_ino.to_bytes(8, "little")  # as if written beside this copy
    cols = Path(mirror_format.mirror_path(path))
    cols.write_bytes(bytes(data))
    assert _found(path).usable == [False] and mirrors.verify(path) == "ignored"
    assert _same_as_parsed(tmp_path).count("gpu") == 4
    mirror = mirror_format.Mirror()
    mirror.sync(path)
    mirror.close()
    assert cols.read_bytes().startswith(mirror_format.MAGIC)
    assert mirrors.verify(path) == "whole"


def test_agent_health_records_are_mirrored(tmp_path: Path) -> None:
    path = _agent_file(tmp_path)
    health = [
        schema.make_record(
            "agent",
            "gn01",
            T0,
            collector="nvml",
            state="error",
            ok=False,
            duration_s=0.0021,
            error="NVMLError_Unknown: Unknown Error",
        ),
        schema.make_record(
            "agent", "gn01", T0, collector="host", state="ok", ok=True, duration_s=0.1, error=""
        ),
        schema.make_record("agent", "gn01", T0, collector="infiniband", ok=True),
    ]
    writer = LineWriter(mirror=mirror_format.Mirror())
    writer.append(
        path, _sample("gn01", T0) + "".join(schema.dumps(r) + "\n" for r in health).encode()
    )
    writer.close()
    assert mirrors.verify(path) == "whole"
    frame = _same_as_parsed(tmp_path)
    agent = frame.cols["agent"]
    assert [frame.collectors[i] for i in agent["collector"]] == ["nvml", "host", "infiniband"]
    assert agent["ok"].tolist() == [0, 1, 1]
    assert [frame.errors[i] if i >= 0 else None for i in agent["error"]] == [
        "NVMLError_Unknown: Unknown Error",
        "",
        None,
    ]


def test_batches_with_corrupted_records_mirror_what_parsing_reads(tmp_path: Path) -> None:
    """Valid records of every shape, and JSON-valid corruptions of them, batch by batch."""
    rng = random.Random(11)
    path = _agent_file(tmp_path)
    writer = LineWriter(mirror=mirror_format.Mirror())
    records = _good_records(rng, 3000)
    for r in records:  # counters beyond 64 bits stop a mirror (the parser saturates them)
        if r["kind"] == "nic":
            r["xmit_wait"] -= 2**63
    for lo in range(0, len(records), 50):
        batch = [json.dumps(r) for r in records[lo : lo + 50]]
        if lo and rng.random() < 0.2:  # now and then one broken line, late in the file
            batch[rng.randrange(len(batch))] = json.dumps(_corrupt(rng, records[lo]))
        writer.append(path, ("\n".join(batch) + "\n").encode())
    writer.close()
    frame = _same_as_parsed(tmp_path)
    assert frame.records > 2500
    found = _found(path)
    assert found.usable == [True] and found.covered[0] > path.stat().st_size // 10
    assert mirrors.verify(path) == "partial"  # up to the first broken line
