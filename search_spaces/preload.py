"""Import TVM's tensor intrinsics fast: every ``ms.TuneContext`` imports them first."""

from __future__ import annotations

from functools import cache
from typing import Any

from search_spaces.quick_import import import_tvm_intrinsics


@cache
def preload_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics fast (:func:`import_tvm_intrinsics`) and register
    Nightshift's over them (``search_spaces.x86.intrin``, and
    ``intrin_amx`` on a host with AMX): every process that builds or replays a schedule
    calls this first."""
    import_tvm_intrinsics()
    from search_spaces.x86.intrin import register_intrinsics
    from search_spaces.x86.intrin_amx import register_amx_intrinsics

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
    from tuner.host import host_cpu_flags

    return "amx_tile" in host_cpu_flags()


