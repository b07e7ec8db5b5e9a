"""The C allocator's policy for a process that analyses a pass a minute (the controller's daemon).

A pass at 100k GPUs allocates and frees some hundreds of megabytes of numpy
temporaries. By default glibc's allocator gives large blocks back to the
kernel as they are freed (each in a mapping of its own) and gives threads
allocator arenas of their own, so the next pass faults in fresh pages: the
kernel zeroes each, and on a virtual machine whose host takes back what its
guest frees, the host backs each afresh. :func:`keep_freed_memory` asks the
allocator to keep what it frees for the next pass instead: one arena, no
mapping per large block, the heap's free top kept up to 2 GiB. Measured on
the 100k benchmark store (docs/analyzer.md, eleventh round): steady passes
3.6-4.3 s against 4.2-5.7 s, kernel time a third lower, and a lower peak (the
freed blocks are used again rather than joined by new ones).

The cost: the process's resident size no longer falls between passes; it stays
near its peak, which a daemon that passes every minute reaches again a minute
later anyway. Only the daemon asks for it, not one-off commands. glibc only:
elsewhere (musl, another C library) nothing changes. After a first pass, which
reads whole hours and frees far more than the passes after it need, the analyzer
gives that back (:func:`give_back_freed_memory`).
"""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters (malloc.h); the values are the same on every architecture.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_POLICY = (
    (_M_ARENA_MAX, 1),  # the tables' threads allocate from the heap the main thread frees to
    (_M_MMAP_MAX, 0),  # large blocks from the heap too: freed, they stay for the next pass
    (_M_TRIM_THRESHOLD, 2**31 - 1),  # the heap's free top is kept (up to 2 GiB)
    (_M_TOP_PAD, 64 << 20),  # and grown 64 MiB at a time, not page by page
)


def keep_freed_memory() -> bool:
    """Ask the C allocator to keep freed memory for later allocations (see the module's
    docstring); return whether it took every setting (False: not glibc, nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # (A list, not a generator: every setting is asked for, even after one is refused.)
    return all([mallopt(param, value) == 1 for param, value in _POLICY])


def give_back_freed_memory() -> bool:
    """Give the kernel the freed memory the allocator keeps (``malloc_trim``), after a pass
    far larger than the next ones: a first pass reads whole hours, and its temporaries
    would otherwise stay the process's size for as long as it runs. Return whether anything
    was given back (False also where this is not glibc)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return bool(trim(0))
