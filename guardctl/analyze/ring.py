"""Memory the kept columns write again instead of giving back: one memory file mapped twice.

A pass a minute appends a minute of records to each kept column and lets go
of the oldest minute. In a plain mapping the new records land on pages never
touched (the kernel zeroes each; on a virtual machine whose host takes back
what its guest frees, the host backs each afresh) and the pages let go are
given back: at 100k GPUs some 200 MB a pass each way, a second of kernel time.

A :class:`Ring` maps one memory file (``memfd_create``) twice, back to back:
bytes ``o`` and ``o + size`` are the same memory, so any run of ``size`` bytes
or fewer, wherever it starts in the first half, is one run of addresses that a
numpy array can view. Records walk forward through it; the pages let go at
the front are the pages the next records are written into.

Linux only (``memfd_create``, ``MAP_FIXED``); where a ring cannot be made (a
sandbox without ``memfd_create``), :class:`Ring` raises ``OSError`` and the
kept columns use plain memory (see ``guardctl.analyze.incremental._Column``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

PAGE = mmap.PAGESIZE
_MAP_FIXED = 0x10  # (the same on every Linux architecture)
# Read faults, not write faults: a read fault on a memory file maps the pages around it too
# (fault-around), and in a shared mapping of one (no write notification) a page read is mapped
# writable, so the writes that follow fault no more. (Linux 5.14 and later; an older kernel
# refuses it, and the pages fault in as they are written.)
_MADV_POPULATE_READ = 22
_PROT_NONE = 0  # (an address range without access costs no memory, nor commit charge)
_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_munmap = _libc.munmap
_munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_madvise = _libc.madvise
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _os_error(call: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{call}: {os.strerror(err)}")


class Ring:
    """*size* bytes (a whole number of pages) seen as ``2 * size`` bytes whose halves are
    the same memory. ``numpy.asarray(ring)`` views them as bytes; any view keeps the
    ring (and its memory) alive."""

    def __init__(self, size: int) -> None:
        self.size, self.addr, self._fd = size, 0, -1
        if size <= 0 or size % PAGE:
            raise ValueError(f"a ring is a whole number of pages, not {size} bytes")
        self._fd = os.memfd_create("guardctl-kept", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, size)
            # The address range first (no memory), then the file twice within it.
            base = _mmap(None, 2 * size, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
            if base in (None, _FAILED):
                raise _os_error("mmap")
            self.addr = base
            for half in (base, base + size):
                got = _mmap(
                    half,
                    size,
                    mmap.PROT_READ | mmap.PROT_WRITE,
                    mmap.MAP_SHARED | _MAP_FIXED,
                    self._fd,
                    0,
                )
                if got != half:
                    raise _os_error("mmap")
        except BaseException:
            self._close()
            raise
        self.__array_interface__: dict[str, Any] = {
            "shape": (2 * size,),
            "typestr": "|u1",
            "data": (base, False),
            "version": 3,
        }

    def let_go(self, lo: int, hi: int, *, keep: bool) -> None:
        """Let go of the whole pages within bytes *lo* to *hi*: unmapped (in both halves)
        but kept in the file, so that writing them again needs no fresh page (*keep*), or
        given back."""
        first, last = -(-lo // PAGE) * PAGE, hi // PAGE * PAGE
        if last <= first:
            return
        if not keep:
            self._advise(first, last, mmap.MADV_REMOVE)  # (the file's pages: both halves)
            return
        a, b = first % self.size, (last - 1) % self.size + 1
        for x, y in ((a, b),) if a < b else ((a, self.size), (0, b)):
            self.unmap(x, y)
            self.unmap(x + self.size, y + self.size)

    def ready(self, lo: int, hi: int) -> None:
        """Map the pages of bytes *lo* to *hi*, about to be written, in one call: the records
        a pass appends land on pages let go a pass before (kept in the file, unmapped), and
        a write fault per page costs several times more (at 100k GPUs, 25,000 pages a pass
        once the rings are warm; 64 MiB kept: 7 ms against 41 ms)."""
        self._advise(lo // PAGE * PAGE, -(-hi // PAGE) * PAGE, _MADV_POPULATE_READ)

    def unmap(self, lo: int, hi: int) -> None:
        """Unmap the pages of bytes *lo* to *hi* (whole pages), keeping what they hold: the
        next use maps them again. A page mapped in both halves is counted twice."""
        self._advise(lo, hi, mmap.MADV_DONTNEED)

    def _advise(self, lo: int, hi: int, advice: int) -> None:
        # Advice only: a page not let go costs memory, never a record (its errors are not
        # the caller's to handle).
        if hi > lo and self.addr:
            _madvise(self.addr + lo, hi - lo, advice)

    def held(self) -> int:
        """Bytes of memory the ring holds (mapped or not)."""
        return os.fstat(self._fd).st_blocks * 512 if self._fd >= 0 else 0

    def _close(self) -> None:
        # Only once no view is left (or none was made): the addresses go.
        if self.addr:
            _munmap(self.addr, 2 * self.size)
            self.addr = 0
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self._close()
