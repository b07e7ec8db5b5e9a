"""Kept columns in fewer bytes, every value as it was read: lossless narrow storage.

The incremental analyzer keeps 15 to 20 minutes of records between passes (at
100k GPUs, 27 million of them), and a parsed record is wide: every integer an
int64, every measurement a float64. Most of those values need far less: a GPU
index, a clock-event bit mask or an error counter that stays at 0 fits a byte;
NVML reports clocks, temperatures and utilisation as integers and power in
milliwatts; the probe writes step times to the microsecond. A :class:`Packing`
stores such a column as

- an integer column in the narrowest of int8, int16 and int32 that holds its
  values, the type's least value standing for the schema's missing integer
  (``INT_MISSING``);
- a float column as integers of ``value * 10**k`` (k = 0 to 6 decimal places)
  where dividing them by ``10**k`` gives back each value bit for bit, the least
  integer standing for NaN; else as float32 where each value converts to it and
  back bit for bit; else as it is.

Every value is checked as it is packed (:meth:`Packing.put`), so a value that
does not fit (an error counter past 127, a power reading in finer units) makes
its column choose again over everything it holds (:func:`choose`): the records
are never changed, only how many bytes they take. Readers get the values back
in the frame's own types (:meth:`Packing.unpack`, :class:`PackedColumns`), so
what a pass computes from packed records is what it computes from the parsed ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from guardctl.telemetry.columns import INT_MISSING

_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_F32 = np.dtype(np.float32)
_NARROW = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32))  # smallest first
_SCALES = tuple(10.0**k for k in range(7))  # decimal places: 0 to 6
_EXACT = 2.0**53  # integers a float64 holds exactly


@dataclass(frozen=True)
class Packing:
    """How one column is stored: *stored* for the frame's *wide* type (the same: as it is);
    a float column stored as integers holds ``value * scale``."""

    stored: np.dtype[Any]
    wide: np.dtype[Any]
    scale: float = 0.0

    @classmethod
    def plain(cls, dtype: np.dtype[Any]) -> Packing:
        return cls(np.dtype(dtype), np.dtype(dtype))

    @property
    def packed(self) -> bool:
        return self.stored != self.wide

    def put(self, out: np.ndarray, values: np.ndarray) -> bool:
        """Write *values* (of the wide type) packed into *out*; False, with *out* partly
        written, when one of them does not fit this packing."""
        if not self.packed:
            out[...] = values
            return True
        if self.wide == _I64:
            return _put_ints(out, values)
        if self.stored == _F32:
            return _put_float32(out, values)
        return _put_scaled(out, values, self.scale)

    def unpack(self, stored: np.ndarray) -> np.ndarray:
        """*stored* values as the wide type (a new array; *stored* itself when not packed)."""
        if not self.packed:
            return stored
        out = stored.astype(self.wide)
        if self.stored == _F32:
            return out
        if self.scale not in (0.0, 1.0):
            out /= self.scale
        missing = stored == np.iinfo(self.stored).min
        if missing.any():
            out[missing] = INT_MISSING if self.wide == _I64 else np.nan
        return out


def choose(values: np.ndarray) -> Packing:
    """The packing that stores *values* (a column as the frame has it) in the fewest bytes."""
    dtype = values.dtype
    if dtype == _I64:
        present = values[values != INT_MISSING]
        for narrow in _NARROW:
            if _within(present, narrow):
                return Packing(narrow, dtype)
    elif dtype == _F64:
        return _choose_float(values)
    return Packing.plain(dtype)


def _choose_float(values: np.ndarray) -> Packing:
    present = values[~np.isnan(values)]
    for scale in _SCALES:
        with np.errstate(over="ignore", invalid="ignore"):
            q = np.rint(present * scale)
        if not (np.abs(q) < _EXACT).all():
            break  # (more places only make larger integers)
        if (_back(q, scale).view(np.int64) == present.view(np.int64)).all():
            narrow = next((t for t in _NARROW if _within(q, t)), None)
            if narrow is not None and _fits(Packing(narrow, _F64, scale), values):
                return Packing(narrow, _F64, scale)
            break  # too large for 32 bits, or a -0.0: more places do not help
    return Packing(_F32, _F64) if _fits(Packing(_F32, _F64), values) else Packing.plain(_F64)


def _fits(packing: Packing, values: np.ndarray) -> bool:
    """Whether every one of *values* packs (what :meth:`Packing.put` checks, value by value:
    a packing that takes a column takes any of its values later)."""
    return packing.put(np.empty(values.size, packing.stored), values)


def _within(values: np.ndarray, narrow: np.dtype[Any] | np.iinfo[Any]) -> bool:
    """Whether *values* (none missing) fit *narrow*, whose least value stands for missing
    (a NaN does not)."""
    if not values.size:
        return True
    info = narrow if isinstance(narrow, np.iinfo) else np.iinfo(narrow)
    return bool(info.min < values.min() and values.max() <= info.max)


def _back(q: np.ndarray, scale: float) -> np.ndarray:
    return q / scale if scale != 1.0 else q


def _put_ints(out: np.ndarray, values: np.ndarray) -> bool:
    info = np.iinfo(out.dtype)
    if _within(values, info):  # (none missing: INT_MISSING is least of all)
        np.copyto(out, values, casting="unsafe")
        return True
    missing = values == INT_MISSING
    if (((values <= info.min) | (values > info.max)) & ~missing).any():
        return False
    np.copyto(out, values, casting="unsafe")
    if missing.any():
        out[missing] = info.min
    return True


def _put_float32(out: np.ndarray, values: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        narrow = values.astype(_F32)
    same = narrow.astype(_F64).view(np.int64) == values.view(np.int64)
    if not (same | np.isnan(values)).all():
        return False
    out[...] = narrow
    return True


def _put_scaled(out: np.ndarray, values: np.ndarray, scale: float) -> bool:
    info = np.iinfo(out.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        q = values * scale
        np.rint(q, out=q)
        q += 0.0  # (-0.0 becomes 0.0, as it does in an integer: a -0.0 does not come back)
    back = _back(q, scale)
    if (back.view(np.int64) == values.view(np.int64)).all() and _within(q, info):
        out[...] = q  # (no NaN: it would not be within)
        return True
    # The slow way, only for a part with a NaN in it (or a value that does not fit).
    nan = np.isnan(values)
    if not nan.any():
        return False
    same = (back.view(np.int64) == values.view(np.int64)) | nan
    q[nan] = 0.0  # (after: *back* may be *q* itself)
    if not same.all() or not _within(q, info):
        return False
    out[...] = q
    out[nan] = info.min
    return True


class PackedColumns(Mapping[str, np.ndarray]):
    """A kind's kept columns as the frame's: each packed one unpacked when it is read (a new
    array each time: a table reads a column, sums it and lets it go), and rows taken
    (:meth:`rows`) before they are unpacked, so that a window's table unpacks only its own."""

    def __init__(self, stored: dict[str, np.ndarray], packings: Mapping[str, Packing]) -> None:
        self._stored = stored
        self._packings = packings

    def __getitem__(self, name: str) -> np.ndarray:
        return self.pick(name, slice(None))

    def __iter__(self) -> Iterator[str]:
        return iter(self._stored)

    def __len__(self) -> int:
        return len(self._stored)

    def pick(self, name: str, which: slice | np.ndarray) -> np.ndarray:
        """``self[name][which]``, unpacking only the rows picked."""
        packing = self._packings.get(name)
        values = self._stored[name][which]
        return packing.unpack(values) if packing is not None else values

    def rows(self, which: slice | np.ndarray) -> PackedColumns:
        """The rows *which* selects (a slice: views), still packed."""
        return PackedColumns({k: v[which] for k, v in self._stored.items()}, self._packings)
