"""Importing TVM's TVMScript-defined intrinsics fast: the stack inspection TVMScript does at every
definition is what makes them slow to import."""

from __future__ import annotations

import inspect
import linecache
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)
_PRELOAD_LOCK = threading.Lock()


def import_tvm_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (which every TuneContext needs) in seconds, not a minute.

    Its ~500 TVMScript prim_funcs each call ``inspect.stack()``, which resolves source files
    and modules for every frame of the stack: 35 s of CPU on a quiet 2-core machine and
    minutes under load, paid by every process that builds a TuneContext (the driver, each
    Ray build worker, the feature extractor). TVM only reads each frame's locals and its
    current line, so for the length of that one import ``inspect.stack`` is swapped for a
    walk of the frames that reads the line straight from ``linecache``: about 5 s here.
    """
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with quick_tvmscript():
        import tvm.s_tir.tensor_intrin  # noqa: F401


@contextmanager
def quick_tvmscript() -> Iterator[None]:
    """Parse TVMScript prim_funcs with :func:`_quick_stack` in place of ``inspect.stack``
    (see :func:`import_tvm_intrinsics`): for modules that define many intrinsics."""
    with _PRELOAD_LOCK:
        original = inspect.stack
        inspect.stack = _quick_stack
        try:
            yield
        finally:
            inspect.stack = original


def _quick_stack(context: int = 1) -> list[inspect.FrameInfo]:
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        filename, lineno = frame.f_code.co_filename, frame.f_lineno
        line = linecache.getline(filename, lineno) if context > 0 else ""
        frames.append(inspect.FrameInfo(frame, filename, lineno, frame.f_code.co_name,
                                        [line] if line else None, 0 if line else None, positions=None))  # fmt: skip
        frame = frame.f_back
    return frames


