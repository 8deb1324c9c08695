"""Import TVM's tensor intrinsics fast: every ``ms.TuneContext`` imports them first."""

from __future__ import annotations

import inspect
import linecache
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

_PRELOAD_LOCK = threading.Lock()


@cache
def preload_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics fast (:func:`import_tvm_intrinsics`) and register
    Nightshift's over them (``search_spaces.templates.intrin_x86``, and
    ``intrin_amx`` on a host with AMX): every process that builds or replays a schedule
    calls this first."""
    import_tvm_intrinsics()
    from search_spaces.templates.intrin_amx import register_amx_intrinsics
    from search_spaces.templates.intrin_x86 import register_intrinsics

    register_intrinsics()
    if host_has_amx():  # 132 intrinsics, seconds of TVMScript parsing: not where no record can use them
        register_amx_intrinsics()
    register_pooling_rules()


# The schedule rules TOPI's pooling computes name in their blocks' ``schedule_rule``
# annotation, and the target keys Nightshift builds for. TVM registers none of them.
POOLING_RULES = ("meta_schedule.pool_max", "meta_schedule.pool_avg",
                 "meta_schedule.adaptive_pool_max", "meta_schedule.adaptive_pool_avg")  # fmt: skip
_TARGET_KEYS = ("cpu", "cuda", "gpu")


def register_pooling_rules() -> None:
    """Register, for each of :data:`POOLING_RULES`, the custom rule MetaSchedule falls back to
    for an unknown one: remove the annotation and schedule the block with the ordinary rules.

    The design spaces are the same as without them; what goes is MetaSchedule's warning
    ("Unknown schedule rule meta_schedule.pool_max ...") in every process that builds a
    pooling task's space, which reads like a failure in the middle of ``tune``'s output.
    """
    import tvm

    def unannotated(sch: Any, block: Any) -> list:
        sch.unannotate(block, "schedule_rule")
        return [sch]

    for rule in POOLING_RULES:
        for key in _TARGET_KEYS:
            name = f"s_tir.meta_schedule.{key}.{rule}"
            if tvm.get_global_func(name, allow_missing=True) is None:
                tvm.register_global_func(name, unannotated)


def host_has_amx() -> bool:
    """Whether this machine's CPU lists AMX tiles (``amx_tile`` in /proc/cpuinfo)."""
    from tuner.device import host_cpu_flags

    return "amx_tile" in host_cpu_flags()


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
