"""The store writer: whole lines only, cut back on failure, bounded buffer through outages."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from agent_helpers import Disk

from guardctl.storage.writer import BufferedStore, LineWriter
from guardctl.telemetry.schema import read_path


def line(i: int, ts: float = 1_800_000_000.0) -> str:
    return f'{{"v":1,"kind":"host","ts":{ts + i},"node":"n1","cpu_pct":{i}.0}}'


def test_appends_whole_lines(tmp_path: Path) -> None:
    writer = LineWriter()
    path = tmp_path / "a" / "b.jsonl"
    writer.append(path, b"one\n")
    writer.append(path, b"two\nthree\n")
    writer.close()
    assert path.read_bytes() == b"one\ntwo\nthree\n"


def test_partial_tail_from_a_killed_writer_is_cut_on_open(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n{"c":')  # killed mid-write
    LineWriter().append(path, b'{"d":4}\n')
    assert path.read_bytes() == b'{"a":1}\n{"b":2}\n{"d":4}\n'


def test_file_of_only_a_partial_line_is_emptied(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"c":')
    LineWriter().append(path, b"x\n")
    assert path.read_bytes() == b"x\n"


def test_short_write_is_cut_back_and_raised(tmp_path: Path) -> None:
    disk = Disk()
    writer = LineWriter(write=disk.write)
    path = tmp_path / "t.jsonl"
    writer.append(path, b"first\n")
    disk.short = True
    with pytest.raises(OSError) as info:
        writer.append(path, b"second line\nthird line\n")
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"first\n"  # nothing torn left behind
    disk.short = False
    writer.append(path, b"again\n")
    assert path.read_bytes() == b"first\nagain\n"


def test_failed_fsync_is_cut_back(tmp_path: Path) -> None:
    def bad_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    path = tmp_path / "t.jsonl"
    with pytest.raises(OSError):
        LineWriter(fsync=bad_fsync).append(path, b"x\n")
    assert path.read_bytes() == b""


def store(
    tmp_path: Path, capacity: int, disk: Disk, caplog: pytest.LogCaptureFixture
) -> BufferedStore:
    caplog.set_level(logging.INFO, logger="test.store")
    return BufferedStore(capacity, logging.getLogger("test.store"), LineWriter(write=disk.write))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EIO])
def test_outage_buffers_then_writes_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    disk = Disk()
    buffered = store(tmp_path, 100, disk, caplog)
    path = tmp_path / "telemetry" / "n1" / "x.jsonl"
    assert buffered.write([(path, line(0))])
    disk.error = code
    for i in range(1, 6):
        assert not buffered.write([(path, line(i))])
    assert not buffered.state.writable and buffered.state.buffered == 5
    assert errno.errorcode[code] in buffered.state.error
    disk.error = None
    assert buffered.write([(path, line(6))])
    result = read_path(path)
    assert [r["cpu_pct"] for r in result.records] == [float(i) for i in range(7)]
    assert result.bad_total == 0 and buffered.state.dropped == 0
    messages = [r.getMessage() for r in caplog.records]
    # one line when it went down, one when it came back: not one per sample
    assert len(messages) == 2
    assert "store unwritable" in messages[0] and errno.errorcode[code] in messages[0]
    assert "writable again" in messages[1] and "0 records dropped" in messages[1]


def test_overflow_drops_oldest_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    disk = Disk()
    buffered = store(tmp_path, 4, disk, caplog)
    path = tmp_path / "x.jsonl"
    disk.error = errno.ENOSPC
    for i in range(10):
        buffered.write([(path, line(i))])
    assert buffered.state.dropped == 6 and buffered.state.buffered == 4
    disk.error = None
    buffered.write([])
    assert [r["cpu_pct"] for r in read_path(path).records] == [6.0, 7.0, 8.0, 9.0]
    assert "6 records dropped" in caplog.records[-1].getMessage()


def test_backlog_across_hours_goes_to_each_hour_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk()
    buffered = store(tmp_path, 100, disk, caplog)
    disk.error = errno.EROFS
    hour1, hour2 = tmp_path / "T10.jsonl", tmp_path / "T11.jsonl"
    buffered.write([(hour1, line(0)), (hour1, line(1))])
    buffered.write([(hour2, line(2))])
    disk.error = None
    buffered.write([(hour2, line(3))])
    assert [r["cpu_pct"] for r in read_path(hour1).records] == [0.0, 1.0]
    assert [r["cpu_pct"] for r in read_path(hour2).records] == [2.0, 3.0]


def test_a_failure_halfway_through_a_backlog_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk()
    buffered = store(tmp_path, 100, disk, caplog)
    disk.error = errno.ENOSPC
    paths = [tmp_path / f"h{i}.jsonl" for i in range(3)]
    for i, path in enumerate(paths):
        buffered.write([(path, line(i))])
    # The backlog is three files; the disk takes the first and fails on the second.
    writes = iter([None, errno.ENOSPC])

    def first_ok_then_full(fd: int, data: bytes) -> int:
        disk.error = next(writes, None)
        return disk.write(fd, data)

    buffered.writer._write = first_ok_then_full
    assert not buffered.write([])
    assert buffered.state.buffered == 2
    assert len(read_path(paths[0]).records) == 1 and paths[1].read_bytes() == b""
    assert buffered.write([])
    assert [read_path(p).records[0]["cpu_pct"] for p in paths] == [0.0, 1.0, 2.0]
    assert all(len(read_path(p).records) == 1 for p in paths)
