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


def atomic_write(path: Path, data: bytes | str, *, mode: int = 0o644, fsync: bool = True) -> None:
    """Replace *path* with *data* atomically (tmp + fsync + rename); StoreError when it cannot.

    *mode* is set explicitly because mkstemp creates 0600 files and other users (node_exporter,
    operators) read these. ``fsync=False`` is for caches that can be rebuilt: a crash may then
    leave an empty file, never a torn one.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    directory = path.parent if str(path.parent) else Path(".")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise StoreError(f"{path}: cannot write: {exc.strerror or exc}") from None


@contextlib.contextmanager
def locked(path: Path, *, blocking: bool = True) -> Iterator[IO[str]]:
    """Hold an exclusive flock on *path* (created if missing) for the ``with`` block.

    With ``blocking=False`` a lock held elsewhere raises BlockingIOError at once, for callers
    that report who holds it instead of waiting. The open file is yielded so that a holder may
    write its name into it.
    """
    try:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise StoreError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        yield handle
    finally:
        handle.close()  # closing releases the lock
