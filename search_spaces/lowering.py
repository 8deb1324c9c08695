"""TVM's TIR lowering pipeline with loop partitioning that works on Relax's int64 tasks.

A template marks a loop whose last iteration is partial with TVM's own annotation,
``pragma_loop_partition_hint``, so that ``LoopPartition`` peels that iteration and the full
ones run without bounds checks (``x86-conv2d-nchwc``'s pixel tiles that do not divide the
pixel count, ``x86-dense``'s row tiles that do not divide the rows). In TVM 0.27 the hint
is lost on the tasks Relax extracts: they index in int64,
``LowerOpaqueBlock`` turns the annotation into an attribute on the loop variable, and
``NarrowDataType(32)`` then gives the loop a new int32 variable and leaves the attribute on
the old one, so nothing is peeled and every tile keeps its guard. On three of ResNet-50's
7x7 conv tasks the same partial-tile points took 0.48-0.60x the time peeled as TVM's own
pipeline built them (median over 34-68 points; AVX2, 2026-11-25, benchmarks/README.md,
"Partial pixel tiles, peeled").

``LoopPartition`` has a second way in, which survives the renaming: conditions wrapped in
``likely``, in loops of constant extent when ``partition_const_loop`` is set. The pipeline
installed here wraps the block predicates below each hinted loop in ``likely`` and runs
TVM's default pipeline, with ``partition_const_loop`` on only when it wrapped something.
Only functions in a build that holds a hinted loop see the setting, and it changes only
loops with a ``likely`` condition, which the Python sources of topi, Relax's legalization
and MetaSchedule never write; partitioning keeps a loop's meaning either way. A module
without a hint lowers exactly as with TVM's pipeline (tested). A function whose kernels
use AMX tiles also puts the calling thread's tile configuration back before it returns
(:func:`search_spaces.x86.intrin_amx.keep_caller_tile_config`), and on CPUs with
AVX512_BF16 its vector casts to bfloat16 run on ``vcvtneps2bf16``
(:func:`search_spaces.x86.bf16_casts.native_bf16_casts`). On CPUs, ``nearbyint`` (the rounding of
every int8 requantize epilogue) goes to LLVM as its intrinsic, which TVM can vectorize
(:func:`llvm_nearbyint`).

:func:`install` registers it as TVM's default (``tvm.compile`` and ``relax.build`` look the
default up by the name ``s_tir``); importing :mod:`search_spaces` installs it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import pipeline as s_tir_pipeline
from tvm.tirx import compilation_pipeline

from search_spaces.ir_map import map_functions

logger = logging.getLogger(__name__)

HINT = "pragma_loop_partition_hint"
_DEFAULT = "s_tir"  # the name tvm.tirx.get_tir_pipeline("default") resolves to
_LOOP_PARTITION = "s_tir.LoopPartition"
_installed = False
_NEARBYINT = tvm.ir.Op.get("tirx.nearbyint")
_FLOAT = 2  # DLPack's type code of float (bfloat16 has its own)


def _likely(realize: s_tir.SBlockRealize) -> s_tir.SBlockRealize:
    pred = realize.predicate
    if isinstance(pred, tirx.IntImm) or (isinstance(pred, tvm.ir.Call) and pred.op.name == "tirx.likely"):
        return realize
    return s_tir.SBlockRealize(realize.iter_values, tirx.likely(pred), realize.block)


def _hinted(loop: tirx.For) -> tirx.For:
    if HINT not in loop.annotations:
        return loop
    return tvm_ffi.structural_map(loop, (s_tir.SBlockRealize, _likely))


def mark_partitions(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the block predicates below every hinted loop wrapped in ``likely``."""
    return tvm_ffi.structural_map(mod, (tirx.For, _hinted))


def _partition_config(ctx: tvm.transform.PassContext) -> dict[str, Any]:
    config = dict(ctx.config)
    current = config.get(_LOOP_PARTITION)
    fields = {}
    if current is not None:
        fields = {k: bool(getattr(current, k)) for k in
                  ("no_unroll_loop_with_extent_one", "unroll_loop_with_partition_hint_no_interval")}
    config[_LOOP_PARTITION] = {**fields, "partition_const_loop": True}
    return config


def _llvm_rounding(call: tvm.ir.Call) -> tirx.PrimExpr:
    # float32 and float64 only: a bfloat16 or float16 one is TVM's to legalize first.
    if not call.op.same_as(_NEARBYINT) or call.ty.dtype.type_code != _FLOAT or call.ty.dtype.bits < 32:
        return call
    return tirx.call_llvm_pure_intrin(call.ty.dtype, "llvm.nearbyint", *call.args)


def llvm_nearbyint(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``nearbyint`` as LLVM's ``llvm.nearbyint`` in its CPU functions.

    TVM 0.27 does not mark ``tirx.nearbyint`` vectorizable (``round`` and ``floor`` are), so
    ``VectorizeLoop`` turns every loop that rounds into a scalar loop and leaves LLVM to
    vectorize it again, which LLVM does for some tiles and not others: in an AVX2 int8 job,
    the epilogue of ResNet-50's 1x1 256->1024 conv with its residual gathered the residual and
    stored the output byte by byte for three of its four vectors. The LLVM intrinsic is the
    same rounding (to nearest even, ``vroundps $12`` on x86), and a ``call_llvm_pure_intrin``
    vectorizes. GPU functions keep TVM's op: their code generators print it."""
    return map_functions(mod, lambda target: target.kind.name == "llvm", (tvm.ir.Call, _llvm_rounding))


def _factory(**kwargs: Any) -> tuple[tvm.transform.Pass, Any, Any]:
    base, host, device = s_tir_pipeline.default_s_tir_pipeline(**kwargs)

    @tvm.transform.module_pass(opt_level=0, name="NightshiftTIRPipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from search_spaces.x86.bf16_casts import native_bf16_casts
        from search_spaces.x86.intrin_amx import keep_caller_tile_config

        mod = llvm_nearbyint(keep_caller_tile_config(mod))
        marked = mark_partitions(mod)
        if marked.same_as(mod):
            return native_bf16_casts(base(mod))
        # Instruments see the passes inside (TVM's pass timing restarts its count here).
        with tvm.transform.PassContext(
            opt_level=ctx.opt_level, required_pass=list(ctx.required_pass), disabled_pass=list(ctx.disabled_pass),
            instruments=list(ctx.instruments), config=_partition_config(ctx),
        ):  # fmt: skip
            return native_bf16_casts(base(marked))

    return _pipeline, host, device


def install() -> None:
    """Make this pipeline TVM's default in this process (idempotent)."""
    global _installed
    if not _installed:
        compilation_pipeline.register_tir_pipeline(_DEFAULT, _factory)
        _installed = True
        logger.debug("TIR pipeline with partition hints for int64 loops installed as %r", _DEFAULT)


@contextlib.contextmanager
def tvm_pipeline() -> Iterator[None]:
    """Within: TVM's own default pipeline, which leaves hinted int64 loops unpeeled (for
    comparisons; this process's default again after)."""
    compilation_pipeline.register_tir_pipeline(_DEFAULT, s_tir_pipeline.default_s_tir_pipeline)
    try:
        yield
    finally:
        compilation_pipeline.register_tir_pipeline(_DEFAULT, _factory if _installed else
                                                   s_tir_pipeline.default_s_tir_pipeline)
