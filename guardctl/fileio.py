"""Writing shared files safely: atomic replacement and exclusive locks.

Readers of guardctl's files (the analyzer, node_exporter's textfile collector, an operator's
``cat``) run while they are rewritten, often on NFS. A file is therefore never rewritten in
place: the new content goes to a temporary file in the same directory, is flushed to disk, and
is renamed over the old one, so a reader sees the old file or the new one, never half of either.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from guardctl.errors import StoreError


@contextlib.contextmanager
def atomic_writer(path: Path, *, mode: int = 0o644, fsync: bool = True) -> Iterator[IO[bytes]]:
    """Write *path* through a binary file that replaces it atomically when the block ends.

    For content written in pieces (the analyzer's column segments); when the block raises, the
    old file stays and the temporary one is removed. *mode* is set explicitly because mkstemp
    creates 0600 files and other users (node_exporter, operators) read these. ``fsync=False`` is
    for caches that can be rebuilt: a crash may then leave an empty file, never a torn one.
    """
    directory = path.parent if str(path.parent) else Path(".")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            yield fh
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = ""
    except OSError as exc:
        raise StoreError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes | str, *, mode: int = 0o644, fsync: bool = True) -> None:
    """Replace *path* with *data* atomically (tmp + fsync + rename); StoreError when it cannot."""
    with atomic_writer(path, mode=mode, fsync=fsync) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def open_locked(path: Path, *, blocking: bool = True) -> IO[str]:
    """Open *path* (created if missing) holding an exclusive flock on it; closing releases it.

    With ``blocking=False`` a lock held elsewhere raises BlockingIOError at once, for callers
    that report who holds it instead of waiting; a holder may write its name into the file.
    """
    try:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (the caller closes it)
    except OSError as exc:
        raise StoreError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BaseException:
        handle.close()
        raise
    return handle


@contextlib.contextmanager
def locked(path: Path, *, blocking: bool = True) -> Iterator[IO[str]]:
    """Hold an exclusive flock on *path* for the ``with`` block (see :func:`open_locked`)."""
    handle = open_locked(path, blocking=blocking)
    try:
        yield handle
    finally:
        handle.close()
