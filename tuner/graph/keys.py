"""A workload's identity: the key of a task's PrimFunc and of a scheduled program.

What the tuning database keys workloads and records by (``tuner.db`` imports it as a result
type of the graph stage, never the graph passes).
"""

from __future__ import annotations

import hashlib
import logging

import tvm
import tvm_ffi
from tvm.s_tir.schedule import Schedule, Trace

from tuner.precision import Precision

logger = logging.getLogger(__name__)


def workload_key(mod: tvm.IRModule, precision: str = "fp32") -> str:
    """Stable key of a PrimFunc module: TVM's structural hash, as hex.

    A reduced ``precision`` (``bf16``, ``int8``) is part of the key of every task of a model
    compiled in it, float32 epilogues included, so records of one precision never serve a
    lookup of another; fp32 keys are the plain hash.
    """
    text = str(tvm_ffi.structural_hash(mod))
    text += Precision.parse(precision).key_suffix
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def program_hash(mod: tvm.IRModule) -> str:
    """Key of a scheduled program: TVM's structural hash of ``sch.mod``, as 16 hex digits.

    Equal programs get equal keys whatever knobs produced them (names of loop variables do
    not count, structure does), in any process: what the database uses to never measure the
    same program twice on one device.
    """
    return f"{tvm_ffi.structural_hash(mod) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def trace_program_hash(trace: Trace, mod: tvm.IRModule) -> str | None:
    """:func:`program_hash` of the program a MetaSchedule trace makes of ``mod``.

    The trace is replayed with its postprocessing, as MetaSchedule stored it; a record from
    MetaSchedule then dedupes against Nightshift's candidates. None if it does not replay.
    """
    sch = Schedule(mod, seed=1)
    try:
        trace.apply_to_schedule(sch, remove_postproc=False)
    except (RuntimeError, ValueError, TypeError) as err:  # tvm.error.TVMError is a RuntimeError
        logger.debug("trace does not replay: %s", err)
        return None
    return program_hash(sch.mod)
