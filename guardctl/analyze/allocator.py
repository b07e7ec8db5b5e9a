"""The C allocator's policy for a process that analyses a pass a minute (the controller's daemon).

A pass at 100k GPUs allocates and frees some hundreds of megabytes of numpy
temporaries. By default glibc's allocator gives large blocks back to the
kernel as they are freed (each in a mapping of its own) and gives threads
allocator arenas of their own, so the next pass faults in fresh pages: the
kernel zeroes each, and on a virtual machine whose host takes back what its
guest frees, the host backs each afresh. :func:`keep_freed_memory` asks the
allocator to keep what it frees for the next pass instead: one arena, no
mapping per large block, the heap's free top kept up to 2 GiB. On the 100k
benchmark store (``bench/analyze_scale.py --steady``) that makes steady passes
shorter, with a third less kernel time and a lower peak (the freed blocks are
used again rather than joined by new ones).

The cost: the process's resident size no longer falls between passes; it stays
near its peak, which a daemon that passes every minute reaches again a minute
later anyway. Only the daemon asks for it, not one-off commands. glibc only:
elsewhere (musl, another C library) nothing changes. After a first pass, which
reads whole hours and frees far more than the passes after it need, the analyzer
gives that back (:func:`give_back_freed_memory`).

The interpreter's cycle collector is held off for the length of a pass
(:func:`cycle_collection_paused`), which every caller wants, daemon or not.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator
from typing import Any

# glibc's mallopt parameters (malloc.h); the values are the same on every architecture.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_INT_MOST = 2**31 - 1  # (mallopt's values are C ints)
_PAGE = 4096
_LARGE_BLOCK = 256 << 10  # above glibc's FASTBIN_CONSOLIDATION_THRESHOLD (64 KiB)
_POLICY = (
    (_M_ARENA_MAX, 1),  # the tables' threads allocate from the heap the main thread frees to
    (_M_MMAP_MAX, 0),  # large blocks from the heap too: freed, they stay for the next pass
    (_M_TRIM_THRESHOLD, _INT_MOST),  # the heap's free top is kept (up to 2 GiB)
    (_M_TOP_PAD, 64 << 20),  # and grown 64 MiB at a time, not page by page
)


def keep_freed_memory() -> bool:
    """Ask the C allocator to keep freed memory for later allocations (see the module's
    docstring); return whether it took every setting (False: not glibc, nothing changed)."""
    libc = _libc()
    if libc is None:
        return False
    mallopt = _mallopt(libc)
    # (A list, not a generator: every setting is asked for, even after one is refused.)
    _policy["taken"] = all([mallopt(param, value) == 1 for param, value in _POLICY])
    return _policy["taken"]


def give_back_freed_memory(keep: float = 0.0) -> bool:
    """Give the kernel the freed memory the allocator keeps (``malloc_trim``), after a pass
    far larger than the next ones: a first pass reads whole hours, and its temporaries
    would otherwise stay the process's size for as long as it runs. Return whether anything
    was given back (False also where this is not glibc).

    *keep*: where the policy above is in force, keep freed memory up to *keep* times the
    memory in use, for the next pass's temporaries: the free blocks within the heap stay
    (mapped: the next pass uses them without a fault), and only the heap's free top beyond
    that goes. Where the free blocks within are more than that already, all of it goes.
    (A pass's temporaries are about what the analyzer holds between passes: at 100k GPUs
    400-490 MiB held, a steady pass's heap 930-1,070 MiB. Given back whole, the first
    pass after it faulted in its temporaries afresh: 0.8 s more.)"""
    libc = _libc()
    if libc is None:
        return False
    heap = _heap(libc) if keep > 0 and _policy["taken"] else None
    if heap is not None and heap.fordblks - heap.keepcost <= keep * heap.uordblks:
        room = int(keep * heap.uordblks) - (heap.fordblks - heap.keepcost)
        return _trim_top(libc, min(room, _INT_MOST - _PAGE), heap.arena)
    trim = libc.malloc_trim
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return bool(trim(0))


@contextlib.contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """Hold CPython's cycle collector off while the block runs, then leave it as it was.

    A pass at 100k GPUs makes a few hundred thousand small containers that live as long as
    the pass (a tuple per file and stage: some 97,500 files). Each 700 of them start a
    young collection; the survivors of those go to the old generation, and once they are a
    quarter of it the collector walks the whole heap: the analyzer's per-file states, its
    name tables, everything the process holds (some 184,000 objects). Measured on the
    benchmark store: three full collections and some 640 young ones a steady pass, about a
    tenth of the pass's time (``bench/analyze_scale.py --steady``). None of that finds garbage a
    pass would miss: what a pass frees goes by reference counting, and a pass leaves no
    reference cycle (tests/analyze/test_incremental.py collects after passes and finds
    none); were there one, the collector's first run after the pass would free it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_policy = {"taken": False}  # whether this process asked for the policy and glibc took it


class _Heap(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): the main heap's figures, in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",  # in use
            "fordblks",  # free, within the heap and at its top
            "keepcost",  # free at its top (what trimming it would give back)
        )
    ]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)  # the C library the interpreter runs on
        libc.malloc_trim  # noqa: B018 (glibc's, where it is glibc)
    except (OSError, AttributeError):
        return None
    return libc


def _mallopt(libc: ctypes.CDLL) -> Any:
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def _heap(libc: ctypes.CDLL) -> _Heap | None:
    try:
        mallinfo2 = libc.mallinfo2
    except AttributeError:  # glibc before 2.33
        return None
    mallinfo2.argtypes = ()
    mallinfo2.restype = _Heap
    heap: _Heap = mallinfo2()
    return heap


def _trim_top(libc: ctypes.CDLL, pad: int, arena: int) -> bool:
    """Give back the heap's free top beyond *pad* bytes, and nothing within: the allocator
    trims its top, keeping *pad*, when a large block is freed while the top is past its
    trim threshold (which ``malloc_trim`` would not leave alone: it gives back the free
    blocks within too). Then the policy's own settings again."""
    mallopt = _mallopt(libc)
    malloc, free = libc.malloc, libc.free
    malloc.argtypes, malloc.restype = (ctypes.c_size_t,), ctypes.c_void_p
    free.argtypes, free.restype = (ctypes.c_void_p,), None
    mallopt(_M_TOP_PAD, pad)
    mallopt(_M_TRIM_THRESHOLD, pad + _PAGE)
    try:
        free(malloc(_LARGE_BLOCK))  # (a block this large is consolidated, and the top trimmed)
    finally:
        for param, value in _POLICY:
            if param in (_M_TOP_PAD, _M_TRIM_THRESHOLD):
                mallopt(param, value)
    after = _heap(libc)
    return after is not None and after.arena < arena
