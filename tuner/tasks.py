"""Tasks: the fused operators of a model, each with its weight, FLOPs and workload key."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import pipeline as relax_pipeline
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops
from tvm.s_tir.schedule import Trace

from tuner.layout import LayoutPlan, prepare, task_layout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """One fused operator to tune.

    Attributes:
        name: TVM's readable name (``fused_conv2d_add_relu``); not unique across shapes.
        mod: an IRModule whose ``main`` is the fused PrimFunc, as TVM's compiler sees it.
        weight: how many times the operator occurs in the model.
        flops: floating-point operations of one call.
        workload_key: stable hex key of the PrimFunc's structure, the database's workload id.
        layout: the conv's data layout (``NCHW``, ``NHWC``, ``NCHW16c``); empty for an
            operator without a conv.
    """

    name: str
    mod: tvm.IRModule
    weight: int
    flops: float
    workload_key: str
    layout: str = ""


def workload_key(mod: tvm.IRModule, precision: str = "fp32") -> str:
    """Stable key of a PrimFunc module: TVM's structural hash, as hex.

    A reduced ``precision`` (``bf16``, ``int8``) is part of the key of every task of a model
    compiled in it, float32 epilogues included, so records of one precision never serve a
    lookup of another; fp32 keys are the plain hash.
    """
    text = str(tvm_ffi.structural_hash(mod))
    if precision != "fp32":
        text += f"/{precision}"
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


def fuse(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The graph passes that turn a Relax model into fused TIR functions.

    The sequence is the one ``meta_schedule.relax_integration.compile_relax`` runs before it
    consults the database, so the tasks tuned here are exactly the functions it looks up.
    """
    try:
        dispatch = list(relax_pipeline.library_dispatch_passes(target))
    except (ValueError, AttributeError):
        dispatch = []
    seq = tvm.transform.Sequential([
        *dispatch,
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ])  # fmt: skip
    with target, tvm.transform.PassContext(opt_level=3):
        return seq(mod)


def extract_tasks(
    mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan | None = None, *, precision: str = "fp32"
) -> list[Task]:
    """Fused-operator tasks of a bound Relax module, heaviest (weight x FLOPs) first.

    ``plan`` sets each conv's data layout (:func:`tuner.layout.prepare`; default
    :meth:`LayoutPlan.for_target`); ``precision`` the model's precision
    (:func:`tuner.precision.apply_precision`); compile with the same plan and precision.
    Identical workloads (same PrimFunc structure) are merged into one task whose weight is
    the number of occurrences.
    """
    from tuner.precision import apply_precision

    plan = LayoutPlan.for_target(target) if plan is None else plan
    fused = fuse(prepare(apply_precision(mod, precision), target, plan), target)
    extracted = ms.relax_integration.extract_tasks(fused, target)
    by_key: dict[str, Task] = {}
    for ext in extracted:
        task_mod = ext.dispatched[0]
        if task_mod["main"].attrs and task_mod["main"].attrs.get("tirx.is_scheduled", False):
            continue
        key = workload_key(task_mod, precision)
        if key in by_key:
            old = by_key[key]
            by_key[key] = Task(old.name, old.mod, old.weight + int(ext.weight), old.flops, key, old.layout)
            continue
        try:
            flops = float(estimate_tir_flops(task_mod))
        except (RuntimeError, ValueError):  # TVM 0.27 raises RuntimeError subclasses
            flops = 0.0
        by_key[key] = Task(str(ext.task_name), task_mod, int(ext.weight), flops, key, task_layout(task_mod))
    tasks = sorted(by_key.values(), key=lambda t: (-t.weight * t.flops, t.name))
    logger.info("%d tasks from %d extracted functions", len(tasks), len(extracted))
    return tasks
