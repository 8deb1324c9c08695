"""numpy's huge-page advice, turned off before a model's weights are made (tuner.memory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy._core.multiarray import _set_madvise_hugepage

from tuner.frontends import load_model
from tuner.memory import small_pages

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _advised(array: np.ndarray) -> bool:
    """Whether a mapping that holds ``array``'s memory carries ``MADV_HUGEPAGE`` (``hg``)."""
    start = array.ctypes.data
    end = start + array.nbytes
    overlaps = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            overlaps = lo < end and start < hi
        elif overlaps and line.startswith("VmFlags:") and "hg" in line.split()[1:]:
            return True
    return False


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


def _fresh_process_check() -> None:
    """Run in a new interpreter by the test below: exits non-zero with a message on failure."""
    _set_madvise_hugepage(True)
    advised = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB
    small_pages()
    plain = np.ones(64 << 20, dtype=np.uint8)
    if not _advised(advised):
        sys.exit("numpy's advice did not show in smaps: the check proves nothing")
    if _advised(plain):
        sys.exit("an array made after small_pages() lies in a range advised MADV_HUGEPAGE")


# The advice, not the kernel's answer to it, is what small_pages controls: whether a huge page
# backs an unadvised range depends on the kernel's settings (per-size mTHP modes, vendor
# knobs) and on fragmentation. A new interpreter: in the test session's process a fresh array
# can land in memory an earlier test's libraries had advised and kept (seen in the full suite).
@pytest.mark.skipif(not _THP.exists(), reason="needs a Linux kernel with transparent huge pages")
@pytest.mark.slow
def test_large_arrays_are_not_advised_after_small_pages():
    here = str(Path(__file__).parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import test_memory; test_memory._fresh_process_check()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_load_model_turns_numpy_advice_off_before_the_weights(numpy_advice):
    _set_madvise_hugepage(True)
    load_model("tiny")
    assert _advice() is False
