"""Compiling a model with the best schedules of the tuning database, and running it.

Every fused operator gets, in order: its best record on this device; else the best record of
another device of the same architecture (flagged); else, on CPUs, a fallback schedule made
from TVM's own design space with fixed, conservative decisions (parallel outer loops, a
vectorizable inner tile); only if even that fails, TVM's default lowering (a naive loop nest,
which made ResNet-50 take seconds per image here). On GPUs an untuned operator gets the CUDA
pipeline's own default schedules (dlight): the CPU fallback's decisions would put a whole
loop in ``blockIdx`` and one thread in each block.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload
from tvm.s_tir.schedule import Trace

from search_spaces import lowering
from search_spaces.constraints import target_with_limits
from search_spaces.preload import preload_tensor_intrinsics
from search_spaces.x86.intrin import target_has
from search_spaces.x86.intrin_amx import AMX_TILE_FEATURE, register_amx_intrinsics
from tuner.codegen import per_function
from tuner.db import TuningDatabase
from tuner.db.selection import FallbackPolicy
from tuner.db.tvm_adapter import DEFAULT_LOWERING, Decision, MetaScheduleDatabase
from tuner.device import Device
from tuner.frontends import ModelSpec
from tuner.graph.layout.plan import LayoutPlan
from tuner.graph.layout.rewrites import prepare
from tuner.graph.tasks import fuse_passes
from tuner.native_log import native_output

logger = logging.getLogger(__name__)

FALLBACK_DESCRIPTION = "fallback schedule: parallel outer loops, vectorized inner tile"
GPU_DEFAULT_DESCRIPTION = "TVM's default GPU schedule (dlight)"

# The widest vector tile the fallback asks for: 16 fp32 lanes fill an AVX-512 register;
# narrower ISAs split it, which LLVM does well.
_VECTOR_TILE = 16
# SampleCategorical of ParallelizeVectorizeUnroll offers (0, 16, 64, 512) unroll steps;
# index 2 (64) unrolls the small inner tiles; 512 inflates LLVM build time.
_UNROLL_CHOICE = 2


@dataclass
class Compiled:
    """A compiled model and what each of its fused operators got.

    ``tuned`` and ``fallback`` map workload keys to function names (``tuned`` includes
    same-architecture records); ``decisions`` says exactly what each function got.
    """

    executable: relax.VMExecutable
    tuned: dict[str, str]
    fallback: dict[str, str]
    compile_s: float
    decisions: dict[str, Decision] = field(default_factory=dict)

    def tuned_in_another_form(self, db: TuningDatabase) -> list[str]:
        """Names of the functions that got no record although ``db`` has records of another
        form of them (:meth:`TuningDatabase.other_forms`): tuned before their code changed."""
        untuned = {k: d.summary for k, d in self.decisions.items()
                   if d.kind in ("fallback", "tvm-default") and d.summary}  # fmt: skip
        return sorted(self.decisions[k].name for k in db.other_forms(untuned)) if untuned else []


def retune_hint(names: list[str]) -> str:
    """What to tell a user whose database tuned ``names`` in an older form."""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"{len(names)} operator(s) have records only for an older form of themselves ({shown}); the "
            "operator changed since it was tuned (e.g. dense weights are packed since 2026-11-25) and "
            "got the fallback schedule: run `tune` on this model to tune its current form")


def compile_model(
    spec: ModelSpec,
    device: Device,
    db: TuningDatabase | None,
    *,
    policy: FallbackPolicy = "same-arch",
    fallback: bool = True,
    plan: LayoutPlan | None = None,
    precision: str = "fp32",
) -> Compiled:
    """Build ``spec`` for ``device``; with ``db``, every tuned operator gets its best schedule.

    Args:
        spec: the model.
        device: the device to build for; its records are looked up in ``db``.
        db: the tuning database, or None for TVM's default build (the untuned reference).
        policy: whether records of another device of the same architecture may stand in.
        fallback: give untuned operators the fallback schedule (else TVM's default lowering;
            on GPUs they always get the CUDA pipeline's default schedules).
        plan: each conv's data layout, as the tasks were extracted with (default
            :meth:`LayoutPlan.for_target`, as :func:`tuner.graph.tasks.extract_tasks`'s).
        precision: the model's precision (:func:`tuner.precision.apply_precision`), as the
            tasks were extracted in; records of another precision are never used.
    """
    from tuner.precision import apply_precision

    start = time.perf_counter()
    # Records replay tensorize steps by intrinsic name (x86-dense-vnni's, ours of TVM's VNNI
    # one): they must be registered in this process before the database is read.
    preload_tensor_intrinsics()
    if target_has(device.target, AMX_TILE_FEATURE):  # a cross-build for an AMX CPU
        register_amx_intrinsics()
    lowering.install()  # the records' partial tiles are peeled as they were when timed
    plan = LayoutPlan.for_target(device.target) if plan is None else plan
    mod = prepare(apply_precision(spec.bound(), precision, device.target), device.target, plan)
    # A cross-build CUDA target (--target-arch, no GPU here) lacks the per-block limits that
    # MetaSchedule's GPU rules and verification need.
    target = target_with_limits(device.target)
    gpu = str(target.kind.name) == "cuda"
    if gpu:
        from tuner.measure.cuda import prepare_cuda_build

        prepare_cuda_build()  # else TVM keeps the kernels' source, which no TVM runtime can load
    # One LLVM module per function on CPUs: TVM's single module costs superlinear time for
    # bf16 (ResNet-50's functions: 31 s against 4 s, tuner.codegen).
    codegen = contextlib.nullcontext() if gpu else per_function()
    if db is None:
        with codegen, target, tvm.transform.PassContext(opt_level=3):
            ex = tvm.compile(mod, target=target)
        return Compiled(ex, {}, {}, time.perf_counter() - start)
    adapter = MetaScheduleDatabase(
        db, db.device_id(device), policy=policy, read_only=True, precision=precision,
        fallback=(lambda w: fallback_record(w, target)) if fallback and not gpu else None,
        untuned=GPU_DEFAULT_DESCRIPTION if gpu else DEFAULT_LOWERING,
    )  # fmt: skip
    # The CUDA compile callback reads the arch from the target in scope; the records refused
    # on the way are said once for the whole compile, not once per function.
    with codegen, target if gpu else contextlib.nullcontext(), db.reading("compile"):
        ex = compile_with_database(adapter, mod, target)
    decisions = dict(adapter.decisions)
    return Compiled(ex, adapter.hits, adapter.misses, time.perf_counter() - start, decisions)


def compile_with_database(database: ms.Database, mod: tvm.IRModule, target: tvm.target.Target) -> relax.VMExecutable:
    """``meta_schedule.relax_integration.compile_relax`` with :func:`tuner.graph.tasks.fuse_passes`
    as its fusion: the functions it looks ``database`` up for are the ones the tasks were
    extracted as (TVM's own sequence would not fold the bf16 pads into their producers)."""
    from tvm.relax import pipeline as relax_pipeline
    from tvm.s_tir import dlight

    gpu = relax_pipeline.BackendDispatcher.is_gpu_target(target)

    @tvm.transform.module_pass(opt_level=3, name="NightshiftApplyDatabase")
    def pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = tvm.transform.Sequential(fuse_passes(target))(mod)
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
        if gpu:  # the functions the database has no record for, as compile_relax does
            mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul(), dlight.gpu.GEMV(), dlight.gpu.Reduction(),
                                              dlight.gpu.GeneralReduction(), dlight.gpu.Fallback())(mod)  # fmt: skip
        return tvm.transform.Sequential(_lower_passes(target))(mod)

    with target, database, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=target, relax_pipeline=pipeline)


def _lower_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """The passes after scheduling, as ``compile_relax`` takes them: the target's own, or
    (TVM 0.27's CPU backend has no ``dataflow_lower_passes``) its fixed list."""
    from tvm.relax import pipeline as relax_pipeline

    try:
        return [*relax_pipeline.dataflow_lower_passes(target), *relax_pipeline.finalize_passes(target)]
    except (ValueError, AttributeError):
        t = relax.transform
        return [t.RewriteDataflowReshape(), t.ToNonDataflow(), t.RemovePurityChecking(), t.CallTIRRewrite(),
                t.StaticPlanBlockMemory(), t.LowerAllocTensor(), t.KillAfterLastUse(), t.LowerRuntimeBuiltin(),
                t.ComputePrimValue(), t.VMShapeLower(), t.AttachGlobalSymbol()]  # fmt: skip


def fallback_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> Schedule | None:
    """A sensible untuned schedule of a PrimFunc module, or None if TVM's space has none.

    Takes TVM's own design space (``post-order-apply``: multi-level tiling, auto-inline,
    parallel-vectorize-unroll) and fixes every sampling decision instead of drawing it: all
    of each loop's extent in the outermost tile (so the postprocessor parallelizes the fused
    outer loops over the cores) except the innermost spatial loop, whose innermost tile is the
    largest divisor up to 16 (preferring 16, 8, 4) for LLVM to vectorize; a modest unroll;
    producers computed at root. The first sketch that passes TVM's postprocessors wins.
    Deterministic: the same module and target give the same schedule.
    """
    preload_tensor_intrinsics()
    ctx = ms.TuneContext(
        mod=mod, target=target, space_generator="post-order-apply", task_name="fallback",
        rand_state=1, num_threads=1,
    )  # fmt: skip
    postprocs = list(ctx.space_generator.postprocs)
    for sketch in ctx.space_generator.generate_design_space(mod):
        insts = list(sketch.trace.insts)
        if any(i.kind.name == "Blockize" for i in insts):
            # A tensorized sketch (VNNI on int8): its tiles must fit the intrinsic, which the
            # fixed decisions below do not know; the plain sketch after it is the fallback.
            continue
        samples = [i for i in insts if i.kind.name.startswith("Sample")]
        decisions = {inst: _fallback_decision(inst, sketch.trace.decisions[inst], samples[k + 1:k + 2])
                     for k, inst in enumerate(samples)}  # fmt: skip
        sch = Schedule(mod, seed=1)
        try:
            Trace(insts, decisions).apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            if all(p.apply(sch) for p in postprocs):
                return sch
        except (RuntimeError, ValueError, TypeError) as err:  # TVM's schedule errors are of all three kinds
            logger.debug("fallback sketch rejected: %s", str(err).splitlines()[0] if str(err) else err)
    return None


def _fallback_decision(inst, sampled, following: list):
    kind = inst.kind.name
    if kind == "SamplePerfectTile":
        n, max_inner = int(inst.attrs[0]), int(inst.attrs[1])
        extent = int(np.prod([int(x) for x in sampled]))
        # Multi-level tiling samples a block's loops in order, spatial ones (n > 2 tiles on
        # CPU) first; the last of a run of n-way spatial tiles is the innermost spatial loop.
        nxt = following[0] if following else None
        innermost = n > 2 and not (
            nxt is not None and nxt.kind.name == "SamplePerfectTile" and int(nxt.attrs[0]) == n
        )
        if innermost:
            lanes = _inner_tile(extent, min(_VECTOR_TILE, max_inner if max_inner > 0 else _VECTOR_TILE))
            return [extent // lanes] + [1] * (n - 2) + [lanes]
        return [extent] + [1] * (n - 1)
    if kind == "SampleCategorical":
        return min(_UNROLL_CHOICE, len(inst.attrs[0]) - 1)
    if kind == "SampleComputeLocation":
        return -1  # at root: always valid
    return sampled


def _inner_tile(extent: int, cap: int) -> int:
    for lanes in (16, 8, 4):
        if lanes <= cap and extent % lanes == 0:
            return lanes
    return max(d for d in range(1, min(extent, cap) + 1) if extent % d == 0)


def fallback_record(workload: Workload, target: tvm.target.Target) -> tuple[TuningRecord, str] | None:
    """The fallback schedule of ``workload`` as a MetaSchedule record (no timings), described."""
    mod = workload.mod
    try:
        sch = fallback_schedule(mod, target)
    except Exception as err:  # whatever TVM raises, a missing fallback only costs speed
        logger.warning("no fallback schedule for %s: %s", _name(mod), str(err).splitlines()[0] if str(err) else err)
        return None
    if sch is None:
        logger.info("no fallback schedule for %s; TVM's default lowering is used", _name(mod))
        return None
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"]) if _has_main(mod) else None
    return TuningRecord(sch.trace, workload, None, target, args_info), FALLBACK_DESCRIPTION


def _has_main(mod: tvm.IRModule) -> bool:
    return any(g.name_hint == "main" for g in mod.get_global_vars())


def _name(mod: tvm.IRModule) -> str:
    return mod.get_global_vars()[0].name_hint


def run_model(
    compiled: Compiled, device: Device, inputs: list[np.ndarray], *, budget_s: float = 3.0
) -> tuple[list[np.ndarray], float]:
    """Run the compiled model on ``inputs``: its outputs and the median latency in seconds
    (:func:`time_model`)."""
    out, samples = time_model(compiled, device, inputs, budget_s=budget_s)
    return out, float(np.median(samples))


def time_model(
    compiled: Compiled, device: Device, inputs: list[np.ndarray], *, budget_s: float = 3.0
) -> tuple[list[np.ndarray], list[float]]:
    """Run the compiled model on ``inputs``: its outputs and the seconds of each timed run.

    The first call gives the outputs and warms up; then as many timed runs as fit in
    ``budget_s`` (at least one, at most 50), since an untuned model can take 25 s a run. Each
    is timed as every latency Nightshift prints (:func:`tuner.app.run.time_runs`).
    """
    from tuner.app.run import WARMUP_S, time_runs

    device.use_threads()
    dev = device.tvm_device()
    with native_output():  # on an Executable it exports and loads: TVM's "Scope" lines, to the log
        vm = relax.VirtualMachine(compiled.executable, dev)

    def call() -> list[np.ndarray]:
        return _flatten(vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs]))

    first = time.perf_counter()
    out = call()
    first = time.perf_counter() - first
    repeat = int(min(max(budget_s / max(first, 1e-6), 1), 50))
    # The first call counts towards the warm-up (an untuned model's one run may take seconds).
    return out, time_runs(call, repeat, warmup=0, warmup_s=max(WARMUP_S - first, 0.0))


def _flatten(out) -> list[np.ndarray]:
    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    return [x for o in out for x in _flatten(o)]


# Relative output difference beyond which a tuned build is wrong (as `tune`'s closing check).
VERIFY_TOLERANCE = 1e-2
# `--verify auto` builds and runs the untuned reference only for models up to this many FLOPs:
# TVM's default lowering is a naive loop nest (seconds per image for ResNet-50 here).
VERIFY_AUTO_MAX_FLOPS = 2e9


def verify_wanted(mode: str, spec: ModelSpec, device: Device) -> bool:
    """Whether ``compile --verify MODE`` checks the output: ``on``; ``off``; ``auto`` when the
    device is here and the model is small enough for the untuned reference to be cheap."""
    if mode != "auto":
        return mode == "on"
    if not device.present:
        return False
    from tuner.graph.tasks import extract_tasks

    flops = sum(t.weight * t.flops for t in extract_tasks(spec.bound(), device.target))
    return flops <= VERIFY_AUTO_MAX_FLOPS


def verify_model(spec: ModelSpec, device: Device, compiled: Compiled, *, plan: LayoutPlan | None = None,
                 reference: Compiled | None = None) -> float | None:  # fmt: skip
    """Run ``compiled`` and the untuned build (or ``reference``) on the same random input;
    None when their outputs agree within :data:`VERIFY_TOLERANCE`, else the worst relative
    difference (inf for a NaN or a different output structure)."""
    worst = max_difference(spec, device, compiled, plan=plan, reference=reference)
    return None if np.isfinite(worst) and worst <= VERIFY_TOLERANCE else float(worst)


def max_difference(spec: ModelSpec, device: Device, compiled: Compiled, *, plan: LayoutPlan | None = None,
                   reference: Compiled | None = None) -> float:  # fmt: skip
    """The worst relative difference between the outputs of ``compiled`` and of the untuned
    build (or ``reference``) on the same random input; inf for a different output structure."""
    if reference is None:
        reference = compile_model(spec, device, None, plan=plan)
    inputs = spec.random_inputs(seed=0)
    want = _outputs(reference, device, inputs)
    got = _outputs(compiled, device, inputs)
    if len(want) != len(got) or any(a.shape != b.shape for a, b in zip(want, got, strict=True)):
        return float("inf")
    worst = 0.0
    for a, b in zip(want, got, strict=True):
        scale = max(float(np.max(np.abs(a))), 1e-6)
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))) / scale)
    return worst


def _outputs(compiled: Compiled, device: Device, inputs: list[np.ndarray]) -> list[np.ndarray]:
    device.use_threads()
    dev = device.tvm_device()
    with native_output():  # on an Executable it exports and loads: TVM's "Scope" lines, to the log
        vm = relax.VirtualMachine(compiled.executable, dev)
    return _flatten(vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs]))
