"""The analyzer's reading helper (``guardctl.tails``), a real process reading real files.

It must report what ``stat`` says of each file, read exactly the bytes of each
mirror asked for (behind the room left for the string rows), refuse a mirror of
another file, stop a group at the first file that does not fit, and go away
when the analyzer does.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guardctl import tails
from guardctl.telemetry import mirror
from guardctl.telemetry.schema import dumps, make_record


def _lines(node: str, start: float, n: int) -> bytes:
    return b"".join(
        dumps(make_record("host", node, start + 10 * i, cpu_util=0.1 * (i % 10))).encode() + b"\n"
        for i in range(n)
    )


Store = tuple[Path, list[Path], Path, mirror.Mirror]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """Four JSON Lines files with mirrors, as a writer leaves them, and one without."""
    writer = mirror.Mirror()
    paths = []
    for i in range(4):
        path = tmp_path / f"node{i:02d}.jsonl"
        data = _lines(f"node{i:02d}", 1_764_547_200.0, 5 + 3 * i)
        path.write_bytes(data)
        writer.append(path, 0, data)
        paths.append(path)
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(_lines("plain", 1_764_547_200.0, 4))
    yield tmp_path, paths, plain, writer
    writer.close()


def _item(
    helper: tails.Helper, path: Path, offset: int = 0, at: int = -1, prefix: int = 0
) -> tails.Item:
    return (helper.file_id(os.fspath(path), mirror.mirror_path(path)), offset, at, prefix)


def test_reads_what_each_file_holds_and_reports_what_stat_says(store: Store) -> None:
    root, paths, plain, writer = store
    cols = [Path(mirror.mirror_path(p)).read_bytes() for p in paths]
    width = mirror.WIDTH
    # paths[1]: read from its second row on, behind two rows of room for its string rows.
    tail_at = mirror.PREAMBLE_SIZE + width
    copied = root / "copied.jsonl"  # a file whose mirror is a copy of another's
    copied.write_bytes(paths[3].read_bytes())
    Path(mirror.mirror_path(copied)).write_bytes(cols[0])
    helper = tails.Helper(room=1 << 20)
    try:
        items = [
            _item(helper, paths[0]),
            _item(helper, paths[1], offset=1, at=tail_at, prefix=2 * width),
            _item(helper, root / "gone.jsonl"),
            _item(helper, paths[2], offset=paths[2].stat().st_size),  # nothing new
            _item(helper, plain),  # no mirror
            _item(helper, copied),  # a mirror, of another file
        ]
        helper.send(1, items)
        buffer, found = helper.collect()
        assert buffer == 1
        stats = [p.stat() for p in (paths[0], paths[1])]
        rows0 = (len(cols[0]) - mirror.PREAMBLE_SIZE) // width
        rows1 = (len(cols[1]) - tail_at) // width
        assert found == [
            (tails.READ, stats[0].st_size, stats[0].st_ino, rows0),
            (tails.READ, stats[1].st_size, stats[1].st_ino, rows1),
            (tails.VANISHED, 0, 0, 0),
            (tails.SAME, paths[2].stat().st_size, paths[2].stat().st_ino, 0),
            (tails.NO_MIRROR, plain.stat().st_size, plain.stat().st_ino, 0),
            (tails.NO_MIRROR, copied.stat().st_size, copied.stat().st_ino, 0),
        ]
        got = bytes(helper.buffers[1].map[: (rows0 + 2 + rows1) * width])
        assert got[: rows0 * width] == cols[0][mirror.PREAMBLE_SIZE :]
        assert got[(rows0 + 2) * width :] == cols[1][tail_at:]
        # The file grows: the next group reads its new rows (the mirror it kept open).
        more = _lines("node00", 1_764_547_300.0, 3)
        start = paths[0].stat().st_size
        with open(paths[0], "ab") as fh:
            fh.write(more)
        writer.append(paths[0], start, more)
        helper.send(0, [_item(helper, paths[0], offset=start, at=len(cols[0]))])
        _, found = helper.collect()
        added = Path(mirror.mirror_path(paths[0])).read_bytes()[len(cols[0]) :]
        assert found == [(tails.READ, start + len(more), stats[0].st_ino, len(added) // width)]
        assert bytes(helper.buffers[0].map[: len(added)]) == added
    finally:
        helper.close()
    assert helper.proc.poll() is not None


def test_a_group_stops_at_the_first_file_that_does_not_fit(store: Store) -> None:
    _, paths, _, _ = store
    sizes = [len(Path(mirror.mirror_path(p)).read_bytes()) - mirror.PREAMBLE_SIZE for p in paths]
    room = sizes[0] + sizes[1] + mirror.WIDTH  # the first two and a row: not the third
    helper = tails.Helper(room=room)
    try:
        helper.send(0, [_item(helper, p) for p in paths])
        _, found = helper.collect()
        assert [f[0] for f in found] == [tails.READ, tails.READ]
        helper.send(1, [_item(helper, paths[2])])  # alone, it fits
        assert helper.collect()[1][0][0] == tails.READ
    finally:
        helper.close()


def test_the_helper_goes_when_the_analyzer_closes_its_end(store: Store) -> None:
    _, paths, _, _ = store
    helper = tails.Helper(room=1 << 20)
    try:
        helper.send(0, [_item(helper, paths[0])])
        helper.collect()
        helper._conn.close()  # as when the analyzer's process dies
        deadline = time.monotonic() + 10
        while helper.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert helper.proc.poll() == 0
    finally:
        helper.close()


def test_groups_and_results_larger_than_the_sockets_buffer_pass_each_other(
    tmp_path: Path,
) -> None:
    """The analyzer sends the next group before it takes the last one's results; with many
    files both messages are larger than a socket's buffer, and neither side may wait for
    the other to read first."""
    files = []
    for i in range(30_000):
        path = tmp_path / f"f{i:05d}.jsonl"
        path.write_bytes(b"{}\n")
        files.append(path)
    sndbuf = socket.socket(socket.AF_UNIX).getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    helper = tails.Helper(room=1 << 20)
    outcome: list[tails.Found] = []
    try:
        items = [_item(helper, p, offset=3) for p in files]  # nothing new in any
        assert len(pickle.dumps(items)) > sndbuf

        def two_groups() -> None:
            helper.send(0, items)
            helper.send(1, items)
            outcome.extend(helper.collect()[1] + helper.collect()[1])

        worker = threading.Thread(target=two_groups, daemon=True)
        worker.start()
        worker.join(timeout=60)
        assert not worker.is_alive(), "the analyzer and its helper wait for each other"
        assert [o[0] for o in outcome] == [tails.SAME] * (2 * len(files))
    finally:
        helper.close()
