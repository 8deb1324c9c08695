"""numpy's huge-page advice, turned off before a model's weights are made (tuner.memory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy._core.multiarray import _set_madvise_hugepage

from tuner.frontends import load_model
from tuner.memory import small_pages

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    try:
        text = _THP.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")]


def _huge_kib(array: np.ndarray) -> int:
    """AnonHugePages (KiB) of the mappings that overlap ``array``'s memory."""
    start = array.ctypes.data
    end = start + array.nbytes
    total, overlaps = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            overlaps = lo < end and start < hi
        elif overlaps and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def _advice() -> bool:
    now = _set_madvise_hugepage(True)
    _set_madvise_hugepage(now)
    return now


@pytest.fixture
def numpy_advice():
    """numpy's advice as the test found it, restored after."""
    before = _advice()
    yield
    _set_madvise_hugepage(before)


@pytest.mark.skipif(_thp_mode() != "madvise", reason="needs transparent huge pages in madvise mode (Linux)")
def test_large_arrays_stay_on_small_pages_after_small_pages(numpy_advice):
    _set_madvise_hugepage(True)
    advised = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
    small_pages()
    plain = np.ones(64 << 20, dtype=np.uint8)
    # Where the kernel had no huge page to give, the advised array proves nothing either.
    if _huge_kib(advised) == 0:
        pytest.skip("the kernel gave the advised array no huge page (memory fragmented)")
    assert _huge_kib(plain) == 0


def test_load_model_turns_numpy_advice_off_before_the_weights(numpy_advice):
    _set_madvise_hugepage(True)
    load_model("tiny")
    assert _advice() is False
