"""The kept columns' ring: one memory file mapped twice, back to back."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from guardctl.analyze.ring import PAGE, Ring


def test_a_run_across_the_end_is_one_array_over_the_same_memory() -> None:
    ring = Ring(4 * PAGE)
    values = np.asarray(ring).view(np.int64)
    room = values.size // 2
    values[room - 3 : room + 5] = np.arange(8)  # written across the end of the first half
    assert values[:5].tolist() == [3, 4, 5, 6, 7]  # its second part is the first half's front
    assert values[room - 3 : room + 5].tolist() == list(range(8))
    assert ring.held() == 2 * PAGE  # the pages written: each once, whatever half


def test_pages_let_go_are_kept_for_the_next_write_or_given_back() -> None:
    ring = Ring(8 * PAGE)
    values = np.asarray(ring).view(np.uint8)
    values[: 8 * PAGE] = 7
    ring.let_go(PAGE // 2, 3 * PAGE, keep=True)  # whole pages only: the second and third
    assert ring.held() == 8 * PAGE and values[PAGE : 3 * PAGE].min() == 7
    assert values[8 * PAGE + PAGE] == 7  # through the other half too
    ring.let_go(7 * PAGE, 9 * PAGE + 1, keep=True)  # a range across the end
    assert ring.held() == 8 * PAGE and values[7 * PAGE] == 7 and values[0] == 7
    ring.let_go(8 * PAGE + 4 * PAGE, 8 * PAGE + 6 * PAGE, keep=False)  # (through the second)
    assert ring.held() == 6 * PAGE
    assert values[4 * PAGE : 6 * PAGE].max() == 0  # (read again: fresh pages)


def test_a_view_keeps_the_ring_and_its_memory() -> None:
    ring = Ring(PAGE)
    gone = weakref.ref(ring)
    view = np.asarray(ring).view(np.float64)[10:20]
    view[:] = 1.5
    del ring
    gc.collect()
    assert gone() is not None and view.sum() == 15.0
    del view
    gc.collect()
    assert gone() is None


def test_a_ring_is_whole_pages() -> None:
    with pytest.raises(ValueError, match="whole number of pages"):
        Ring(PAGE + 8)
