"""Kept columns packed into fewer bytes give back every value bit for bit.

:mod:`guardctl.analyze.packing` stores the incremental analyzer's kept records
narrow (small integers, decimals as scaled integers, float32 where exact) and
hands them back in the frame's types. A value that does not fit the packing a
column has makes it choose again over everything it holds; the records never
change, and a pass judges them as a cold pass judges the parsed ones (the
replays in test_incremental.py compare the two minute by minute).
"""

from __future__ import annotations

import numpy as np
import pytest

from guardctl.analyze import incremental
from guardctl.analyze.packing import PackedColumns, Packing, choose
from guardctl.analyze.ring import Ring
from guardctl.telemetry.columns import INT_MISSING

NAN = np.nan


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtypes and values, floats bit for bit (any NaN equals any NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype != np.float64:
        return bool(np.array_equal(a, b))
    nan = np.isnan(a)
    bits = a[~nan].view(np.int64) == b[~nan].view(np.int64)
    return bool((nan == np.isnan(b)).all() and bits.all())


@pytest.mark.parametrize(
    ("values", "stored", "scale"),
    [
        ([1956.0, 1979.0, 210.0], "int16", 1.0),  # SM clocks (MHz)
        ([661.234, 74.1, NAN, 0.0], "int32", 1000.0),  # NVML power: milliwatts
        ([67.5, 66.4], "int16", 10.0),
        ([9.005812, 0.000001, 1.5], "int32", 1e6),  # the probe's step times, in µs
        ([0.1 + 0.2, 1.0], "float64", 0.0),  # not a decimal: as read
        ([np.pi], "float64", 0.0),
        ([1.764e9 + 0.125], "float64", 0.0),  # a time: too many digits for 32 bits
        ([-0.0, 1.0], "float32", 0.0),  # exact in float32; an integer has no -0
        ([np.inf, 2.5], "float32", 0.0),
        ([NAN, NAN], "int8", 1.0),
        ([1e-7, 3e-6], "float64", 0.0),  # seven places
    ],
)
def test_a_float_column_is_stored_in_the_fewest_bytes_that_give_it_back(
    values: list[float], stored: str, scale: float
) -> None:
    column = np.array(values, np.float64)
    packing = choose(column)
    assert (str(packing.stored), packing.scale) == (stored, scale)
    out = np.empty(column.size, packing.stored)
    assert packing.put(out, column)
    assert _same(packing.unpack(out), column)


@pytest.mark.parametrize(
    ("values", "stored"),
    [
        ([0, 7, 68], "int8"),  # a GPU index, clock-event bits
        ([5, INT_MISSING, -1], "int8"),  # a missing value: the least int8
        ([-127, 127], "int8"),
        ([-128, 0], "int16"),  # the least int8 stands for missing
        ([1023, 0], "int16"),
        ([2**31 - 1, -(2**31) + 1], "int32"),
        ([4_000_000_094, 0], "int64"),  # a 64-bit counter
        ([-(2**31), 5], "int64"),
    ],
)
def test_an_integer_column_is_stored_in_the_narrowest_type_that_holds_it(
    values: list[int], stored: str
) -> None:
    column = np.array(values, np.int64)
    packing = choose(column)
    assert str(packing.stored) == stored
    out = np.empty(column.size, packing.stored)
    assert packing.put(out, column)
    assert _same(packing.unpack(out), column)


def test_a_value_that_does_not_fit_is_refused_not_changed() -> None:
    ints = Packing(np.dtype(np.int8), np.dtype(np.int64))
    assert not ints.put(np.empty(2, np.int8), np.array([3, 128]))
    assert not ints.put(np.empty(1, np.int8), np.array([-128]))  # (missing's own value)
    tenths = Packing(np.dtype(np.int16), np.dtype(np.float64), 10.0)
    assert not tenths.put(np.empty(1, np.int16), np.array([661.25]))  # finer
    assert not tenths.put(np.empty(1, np.int16), np.array([3276.8]))  # larger
    assert not tenths.put(np.empty(1, np.int16), np.array([np.inf]))
    assert not tenths.put(np.empty(1, np.int16), np.array([-0.0]))
    single = Packing(np.dtype(np.float32), np.dtype(np.float64))
    assert not single.put(np.empty(1, np.float32), np.array([0.1]))
    assert not single.put(np.empty(1, np.float32), np.array([1e300]))


def test_packed_columns_read_as_the_frames_and_take_rows_before_unpacking() -> None:
    wide = {
        "ts": np.arange(6.0),
        "power_w": np.array([1.5, 2.25, NAN, 4.0, 5.5, 6.0]),
        "ecc": np.array([0, 1, INT_MISSING, 3, 4, 5]),
    }
    packings = {name: choose(values) for name, values in wide.items() if name != "ts"}
    stored = {"ts": wide["ts"]}
    for name, packing in packings.items():
        stored[name] = np.empty(6, packing.stored)
        assert packing.put(stored[name], wide[name])
    cols = PackedColumns(stored, packings)
    assert list(cols) == list(wide) and len(cols) == 3
    for name, values in wide.items():
        assert _same(cols[name], values)
        keep = np.array([True, False, True, True, False, True])
        assert _same(cols.pick(name, keep), values[keep])
        assert _same(cols.rows(slice(2, 5))[name], values[2:5])
        assert _same(cols.rows(keep)[name], values[keep])
    assert cols["ts"].base is not None  # (a column kept as read is a view, not a copy)


@pytest.mark.parametrize("rings", ["all", "none"])
def test_kept_columns_pack_anew_when_a_value_does_not_fit(
    rings: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU's error counter past what a byte holds, then past 32 bits; its power read in
    milliwatts after tenths of a watt, then as no decimal at all: each column packs anew,
    at whatever point of its ring the records lie, and gives back every record."""

    def no_ring(size: int) -> Ring:
        raise OSError(38, "memfd_create: Function not implemented")

    if rings == "none":
        monkeypatch.setattr(incremental, "Ring", no_ring)
    rng = np.random.default_rng(3)
    cols = incremental._Columns("gpu")
    names = [name for name in cols._cols if name not in ("segment", "end")]
    kept: dict[str, list[np.ndarray]] = {name: [] for name in names}
    stored: list[tuple[str, str]] = []
    clock = 0.0
    for step in range(60):
        m = int(rng.integers(1000, 6000))
        new = {name: np.zeros(m, np.int64) for name in names}
        new["ts"] = clock + np.sort(rng.random(m)) * 60.0
        new["node"] = rng.integers(0, 50, m).astype(np.int32)
        new["job"] = np.full(m, -1, np.int32)
        for name in ("sm_clock_mhz", "power_limit_w", "temp_c", "util_pct"):
            new[name] = rng.integers(0, 100, m).astype(np.float64)
        power = rng.integers(500_000, 700_000, m) / 1000.0  # milliwatts
        new["power_w"] = np.round(power, 1) if step < 20 else power if step < 40 else power + np.pi
        ecc = rng.integers(0, 100, m)
        if step >= 25:
            ecc[rng.integers(0, m)] = 300 if step < 45 else 2**40
        new["ecc_sbe_volatile"] = np.where(rng.random(m) < 0.01, INT_MISSING, ecc)
        clock += 60.0
        cols.append({**new, "segment": np.zeros(m, np.int32)})
        for name in names:
            kept[name].append(new[name])
        keep = ~(cols.view()["ts"] < clock - 600.0)  # ten minutes kept
        cols.keep(keep)
        cols.fit()
        view = cols.view()
        for name in names:
            values = np.concatenate(kept[name])[keep]
            kept[name] = [values]
            assert _same(view[name], values), (step, name)
        stored.append((str(cols._cols["power_w"].dtype), str(cols._cols["ecc_sbe_volatile"].dtype)))
    assert stored[10] == ("int16", "int8")  # tenths of a watt (up to 700.0); a byte
    assert stored[30] == ("int32", "int16")  # milliwatts; past 127
    assert stored[59] == ("float64", "int64")  # no decimal; past 32 bits
    assert str(cols._cols["gpu"].dtype) == "int8" and str(cols._cols["ts"].dtype) == "float64"
