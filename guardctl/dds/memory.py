"""The ledger's in-memory containers, shaped so that a service that grows never pauses long.

A job's ledger holds every lease it granted and every shard of its epochs:
millions of entries. Two things about CPython's plain containers then stall
the event loop, and with it every request in flight:

* a ``dict`` grows by copying itself whole into a table twice as large:
  at 1.4 million entries one insertion takes about 50 ms on the service's
  machine, at 2.8 million about 120 ms, and the pause doubles with each
  growth after;
* a ``list`` or ``deque`` of ints is millions of objects that every full
  garbage collection visits (about 0.1 s for two million shards, on every
  collection).

:class:`SplitDict` spreads a mapping over many small dicts, so a growth copies
one of them; :class:`ShardQueue` keeps shard numbers in an array of machine
integers, which the collector does not look into.
"""

from __future__ import annotations

import ctypes
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R", bound=tuple[Any, ...])
_MISSING = object()


PARTS = 512  # how many dicts a SplitDict keeps; a power of two: the part is the hash's low bits
_MASK = PARTS - 1


class SplitDict(MutableMapping[K, V], Generic[K, V]):
    """A mapping kept in ``PARTS`` dicts chosen by the key's hash: no growth copies it whole.

    At 20 million entries a part holds about 40 000, and its growth takes
    about a millisecond. Lookups cost one more hash-and-index (the hash of a
    str is cached on it; an int is its own). The size is counted as entries
    come and go (the ledger asks for it on every acknowledgement). Iteration
    order is by part, not by insertion.
    """

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[dict[K, V]] = [{} for _ in range(PARTS)]
        self.size = 0

    def __getitem__(self, key: K) -> V:
        return self.parts[hash(key) & _MASK][key]

    def __setitem__(self, key: K, value: V) -> None:
        part = self.parts[hash(key) & _MASK]
        before = len(part)
        part[key] = value
        self.size += len(part) - before

    def __delitem__(self, key: K) -> None:
        del self.parts[hash(key) & _MASK][key]
        self.size -= 1

    def __contains__(self, key: object) -> bool:
        return key in self.parts[hash(key) & _MASK]

    def get(self, key: K, default: Any = None) -> Any:
        return self.parts[hash(key) & _MASK].get(key, default)

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        part = self.parts[hash(key) & _MASK]
        if default is _MISSING:
            value = part.pop(key)
            self.size -= 1
            return value
        before = len(part)
        value = part.pop(key, default)
        self.size -= before - len(part)
        return value

    def fill(self, pairs: Iterable[tuple[K, V]]) -> None:
        """Set many entries at once (a load), without a method call per entry.

        Loading a ledger of 1.5 million leases set 4.5 million entries: 5.6 s
        through ``__setitem__``, 2.0 s this way.
        """
        parts = self.parts
        for key, value in pairs:
            parts[hash(key) & _MASK][key] = value
        self.size = sum(map(len, parts))

    def key_set(self) -> set[K]:
        """The keys as a set (built part by part, at C speed)."""
        keys: set[K] = set()
        for part in self.parts:
            keys.update(part)
        return keys

    def __iter__(self) -> Iterator[K]:
        for part in self.parts:
            yield from part

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0


def _untracker() -> Any:
    try:
        untrack = ctypes.pythonapi.PyObject_GC_UnTrack  # CPython's C API
    except AttributeError:  # another interpreter: leave records to its collector
        return None
    untrack.argtypes = [ctypes.py_object]
    untrack.restype = None
    return untrack


_UNTRACK = _untracker()


def plain_record(record: R) -> R:
    """*record*, a tuple of plain values (ints, floats, strings, None), untracked by the collector.

    A tuple of plain values cannot be part of a reference cycle, and CPython's
    collector stops tracking one the first time a collection looks at it. But
    the service collects only in sweeps (see :mod:`guardctl.dds.collector`),
    so a lease record would stay tracked, and be walked, until the next
    sweep: two records per lease, 0.5 s for a million leases. This does at
    once what that first collection would do (about 0.2 us).
    """
    if _UNTRACK is not None:
        _UNTRACK(record)
    return record


class ShardQueue:
    """An epoch's shards still to hand out: a cursor over an array, behind a few requeued ones.

    The array (the epoch's order, or what is left of it on resume) holds
    machine integers, so the collector visits one object, not a shard each.
    Shards that come back (expired leases) go to the front, in a deque of
    their own that stays small. An entry may be stale (its shard done or
    leased again since): the caller skips it.
    """

    __slots__ = ("front", "next", "pending")

    def __init__(self, pending: array[int]) -> None:
        self.pending = pending
        self.next = 0
        self.front: deque[int] = deque()

    def __bool__(self) -> bool:
        return bool(self.front) or self.next < len(self.pending)

    def __iter__(self) -> Iterator[int]:
        yield from self.front
        yield from self.pending[self.next :]

    def popleft(self) -> int:
        if self.front:
            return self.front.popleft()
        shard = self.pending[self.next]
        self.next += 1
        return shard

    def appendleft(self, shard: int) -> None:
        self.front.appendleft(shard)
