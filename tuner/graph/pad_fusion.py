"""A dot-product conv's padded input, written by the function that produces it.

A bf16 conv on ``vdpbf16ps`` reads its input already padded: TVM computes a bfloat16 buffer
that a function allocates in float32 (``BF16ComputeLegalize``), which the instruction cannot
read, so the padding cannot be a block of the conv's own function. Until 2026-11-27 it was a
function of its own that read the producer's whole output back and wrote it again. A uint8
conv on ``vpdpbusd`` (zero point 0, so its border is 0) could pad in its own function, but
that too is a pass over the data before the sums; it is padded the same way
(:data:`tuner.graph.layout.legalize.PAD_APART`).

:func:`emit_padded` (called by :mod:`tuner.graph.layout` for such a conv) pads in two functions:
:func:`pad_interior` copies the data into the interior of the padded shape, and
:func:`zero_border` zeroes the border in place. Between ``FuseOps`` and ``FuseTIR``,
:func:`fold_pad_into_producer` moves the copy into the fused function that produced the
data when the copy is its only reader (ResNet-50: the 1x1 conv + bias + relu + cast, or
requantize, before each 3x3 conv), where ``x86-conv2d-nchwc-dot`` and ``x86-conv2d-amx``
store each register tile at its offset in the padded output (in the wide block of an AMX
conv's input too, :func:`tuner.graph.layout.plan.wide_blocks`). :func:`tuner.graph.tasks.fuse_passes` runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tvm
from tvm import relax
from tvm.script import tirx as T

from search_spaces.templates.x86_conv2d_nchwc_dot import PADDED_OUTPUT

logger = logging.getLogger(__name__)

# The attribute that marks a padding function this pass may move.
PAD_ATTR = "nightshift.dot_input_pad"
_OPAQUE = 8  # relax's OpPatternKind kOpaque


def _opaque(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    # FuseOps keeps an opaque function to itself (AnnotateTIROpPattern keeps a set pattern).
    return func.with_attr("op_pattern", _OPAQUE)


def pad_interior(shape: Sequence[int], padding: Sequence[int], dtype: str, block: int | None = None,
                 ) -> tvm.tirx.PrimFunc:  # fmt: skip
    """The copy of ``NCHW{b}c`` data of ``shape`` into the interior of its padded shape
    (``padding``: top, left, bottom, right), the border left as it is; marked for
    :func:`fold_pad_into_producer`. :func:`zero_border` completes the padding.

    With ``block`` (a multiple of ``b``), the padded copy is ``NCHW{block}c``: ``block / b``
    neighbouring chunks side by side in each pixel, the wide rows an AMX conv reads
    (:func:`tuner.graph.layout.plan.wide_blocks`).

    Two functions, not one: a block that writes a buffer another block writes too is not
    "complete" to TIR's schedule, and the conv template moves the copy into its register tile.
    """
    n, c, h, w, b = _int64(shape)
    top, left, bottom, right = _int64(padding)
    if block is not None and block != int(shape[4]):
        return _opaque(_pad_wide(shape, padding, dtype, block)).with_attr(PAD_ATTR, True)

    @T.prim_func(private=True, s_tir=True)
    def pad(x: T.Buffer((n, c, h, w, b), dtype), y: T.Buffer((n, c, h + top + bottom, w + left + right, b), dtype)):
        for i0, i1, i2, i3, i4 in T.grid(n, c, h, w, b):
            with T.sblock(PADDED_OUTPUT):
                v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                y[v0, v1, v2 + top, v3 + left, v4] = x[v0, v1, v2, v3, v4]

    return _opaque(pad).with_attr(PAD_ATTR, True)


def _pad_wide(shape: Sequence[int], padding: Sequence[int], dtype: str, block: int) -> tvm.tirx.PrimFunc:
    """:func:`pad_interior`'s copy into ``NCHW{block}c``: chunk ``c`` of the data is lanes
    ``(c % k) b`` on of wide chunk ``c // k``."""
    n, c, h, w, b = _int64(shape)
    top, left, bottom, right = _int64(padding)
    k = block // int(shape[4])
    wc, wb = _int64([int(shape[1]) // k, block])

    @T.prim_func(private=True, s_tir=True)
    def pad(x: T.Buffer((n, c, h, w, b), dtype), y: T.Buffer((n, wc, h + top + bottom, w + left + right, wb), dtype)):
        for i0, i1, i2, i3, i4 in T.grid(n, c, h, w, b):
            with T.sblock(PADDED_OUTPUT):
                v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                y[v0, v1 // k, v2 + top, v3 + left, v1 % k * b + v4] = x[v0, v1, v2, v3, v4]

    return pad


def zero_border(shape: Sequence[int], padding: Sequence[int], dtype: str) -> tvm.tirx.PrimFunc:
    """Zero the border of a padded ``NCHW{b}c`` tensor in place (``shape`` the unpadded one).

    Written scheduled, and marked so (no task, no record): the border alone, row by row and
    column by column (LLVM stores a channel block as one vector), on one thread (a few thousand
    bytes, less than a thread pool's hand-off costs)."""
    n, c, h, w, b = _int64(shape)
    top, left, bottom, right = _int64(padding)
    out_h, out_w = h + top + bottom, w + left + right

    @T.prim_func(private=True, s_tir=True)
    def border(y: T.Buffer((n, c, out_h, out_w, b), dtype)):
        for i0, i1, i2, i3 in T.grid(n, c, top + bottom, out_w):
            for i4 in T.serial(b):
                y[i0, i1, T.if_then_else(i2 < top, i2, i2 + h), i3, i4] = T.Cast(dtype, 0)
        for i0, i1, i2, i3 in T.grid(n, c, h, left + right):
            for i4 in T.serial(b):
                y[i0, i1, i2 + top, T.if_then_else(i3 < left, i3, i3 + w), i4] = T.Cast(dtype, 0)

    return _opaque(border).with_attr("tirx.is_scheduled", True)


def emit_padded(bb: relax.BlockBuilder, data: relax.Expr, padding: Sequence[int], block: int | None = None,
                ) -> relax.Expr:  # fmt: skip
    """Emit the zero padding of static ``NCHW{b}c`` ``data`` by ``padding`` (top, left,
    bottom, right): :func:`pad_interior` (into ``NCHW{block}c`` with ``block``), then
    :func:`zero_border` in place. With no padding and a ``block``, the copy into wide blocks
    alone, which :func:`fold_pad_into_producer` moves into the producer just the same."""
    top, left, bottom, right = padding
    shape = [int(d) for d in data.ty.shape.values]
    dtype = str(data.ty.dtype)
    wide = shape if block is None else [shape[0], shape[1] * shape[4] // block, shape[2], shape[3], block]
    ty = relax.TensorType([*wide[:2], wide[2] + top + bottom, wide[3] + left + right, wide[4]], dtype)
    interior = bb.add_func(pad_interior(shape, padding, dtype, block), "pad_NCHWc")
    if not any(padding):  # a copy into wide blocks alone: no border to zero
        return bb.emit(relax.call_tir(interior, [data], ty))
    border = bb.add_func(zero_border(wide, padding, dtype), "pad_border_NCHWc")
    return bb.emit(relax.call_tir_inplace(border, [bb.emit(relax.call_tir(interior, [data], ty))], 0, ty))


def emit_subsampled(bb: relax.BlockBuilder, data: relax.Expr, strides: Sequence[int], block: int) -> relax.Expr:
    """Emit the copy of static ``NCHW{b}c`` ``data`` that a 1x1 conv of ``strides`` reads:
    every ``strides``-th pixel, in ``NCHW{block}c`` (:func:`pad_interior`'s wide blocks), so
    that the conv runs with stride 1 on a whole tile row per pixel. A function of its own:
    the data has other readers (ResNet's downsampling conv shares its input with the block's
    first conv; with stride 1, the block's first conv shares it with the residual)."""
    n, c, h, w, b = (int(d) for d in data.ty.shape.values)
    sh, sw = (int(x) for x in strides)
    oh, ow, k = (h - 1) // sh + 1, (w - 1) // sw + 1, block // b
    dtype = str(data.ty.dtype)
    n_, c_, h_, w_, b_, wc, oh_, ow_, wb = _int64([n, c, h, w, b, c // k, oh, ow, block])
    sh_, sw_, k_ = _int64([sh, sw, k])

    @T.prim_func(private=True, s_tir=True)
    def subsample(x: T.Buffer((n_, c_, h_, w_, b_), dtype), y: T.Buffer((n_, wc, oh_, ow_, wb), dtype)):
        for i0, i1, i2, i3, i4 in T.grid(n_, c_, oh_, ow_, b_):
            with T.sblock("subsampled"):
                v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                y[v0, v1 // k_, v2, v3, v1 % k_ * b_ + v4] = x[v0, v1, v2 * sh_, v3 * sw_, v4]

    func = bb.add_func(_opaque(subsample), "subsample_NCHWc")
    return bb.emit(relax.call_tir(func, [data], relax.TensorType([n, c // k, oh, ow, block], dtype)))


def _int64(values: Sequence[int]) -> list[tvm.tirx.IntImm]:
    # int64 like the TE functions' buffers, onto which FuseTIR maps these functions' own.
    return [tvm.tirx.IntImm("int64", int(v)) for v in values]


def _is_pad(mod: tvm.IRModule, call: relax.Call) -> bool:
    if not (isinstance(call, relax.Call) and call.op.same_as(tvm.ir.Op.get("relax.call_tir"))):
        return False
    func = mod[call.args[0]]
    return isinstance(func, tvm.tirx.PrimFunc) and bool(func.attrs and func.attrs.get(PAD_ATTR))


def _is_primitive_call(mod: tvm.IRModule, value: relax.Expr) -> bool:
    if not (isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar)):
        return False
    func = mod[value.op]
    return isinstance(func, relax.Function) and bool(func.attrs and func.attrs.get("Primitive"))


def var_reads(func: relax.Function) -> dict[relax.Var, int]:
    """How many times each variable is read in ``func``'s body (its bindings' left sides not counted)."""
    counts: dict[relax.Var, int] = {}

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    return counts


def _with_pad(producer: relax.Function, pad: relax.Call) -> relax.Function:
    """``producer`` with ``pad`` applied to its output, inside it."""
    body = producer.body
    *blocks, last = body.blocks
    out = relax.Var("padded", pad.ty)
    padded = relax.Call(pad.op, [pad.args[0], relax.Tuple([body.body]), *pad.args[2:]], pad.attrs, pad.ty_args)
    block = relax.DataflowBlock([*last.bindings, relax.VarBinding(out, padded)])
    return relax.Function(producer.params, relax.SeqExpr([*blocks, block], out), pad.ty, producer.is_pure,
                          producer.attrs)  # fmt: skip


@tvm.transform.module_pass(opt_level=0, name="FoldPadIntoProducer")
def fold_pad_into_producer(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Move each marked padding call into the fused function whose output only it reads."""
    main = mod["main"]
    uses = var_reads(main)
    bb = relax.BlockBuilder(mod)
    produced: dict[relax.Var, relax.Call] = {}
    replace: dict[relax.Var, relax.Call] = {}  # a pad's binding -> the call of the folded function
    drop: set[relax.Var] = set()  # the producers' bindings, now inside those functions
    for binding in (b for block in main.body.blocks for b in block.bindings):
        if not isinstance(binding, relax.VarBinding):
            continue
        value = binding.value
        if _is_primitive_call(mod, value):
            produced[binding.var] = value
        elif _is_pad(mod, value):
            (source,) = value.args[1].fields
            producer = produced.get(source)
            if producer is None or uses.get(source) != 1:
                continue
            gvar = bb.add_func(_with_pad(mod[producer.op], value), f"{producer.op.name_hint}_{value.args[0].name_hint}")
            replace[binding.var] = relax.Call(gvar, producer.args)
            drop.add(source)
    if not replace:
        return mod
    blocks = [
        type(block)([relax.VarBinding(b.var, replace[b.var]) if b.var in replace else b
                     for b in block.bindings if b.var not in drop])
        for block in main.body.blocks
    ]  # fmt: skip
    bb.update_func(mod.get_global_var("main"), relax.Function(
        main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure, main.attrs))  # fmt: skip
    logger.debug("folded %d padding functions into their producers", len(replace))
    return bb.get()
