"""Relax legalization of convs, matmuls, layout transforms, softmax and the transcendental
epilogues (GELU in both forms, erf, tanh, sigmoid, SiLU, small integer powers) into the
computes of :mod:`tuner.graph.layout.ops` and TOPI's vectorizable approximations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax, te, topi

from tuner.graph.layout.ops import (
    conv2d_nchwc_dot,
    depthwise_conv2d_nchwc,
    fast_softmax_last_axis,
    group_conv2d_nchwc,
    matmul_packed,
    row_taps,
)
from tuner.graph.layout.packing import (
    pack_dense_weight,
    pack_dot_weight,
    pack_group_weight,
    row_tap_weight,
    unblock_weight,
    widen_weight,
)
from tuner.graph.layout.plan import (
    _constant,
    _widens,
    block_of,
    dense_block,
    dot_elements,
    out_dtype,
    padded_columns,
    row_taps_fit,
)
from tuner.graph.pad_fusion import emit_padded, emit_subsampled

logger = logging.getLogger(__name__)

#: relax's ``OpPatternKind`` ``kInjective``: ``AnnotateTIROpPattern`` keeps a set pattern, and
#: ``FuseOps`` fuses no injective function into the elementwise epilogue of the one before it.
INJECTIVE = 2


def _legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call,
                     winograd_calls: Sequence[tuple[relax.Call, int]] = (),
                     pad_apart: Sequence[str] = ("bfloat16",),
                     wide: Mapping[str, int] | None = None,
                     sole_reader: Collection[relax.Var] = ()) -> relax.Expr:  # fmt: skip
    """TOPI's ``conv2d_NCHWc`` for a blocked conv (the generic legalization leaves it as is),
    :func:`tuner.graph.winograd.conv2d_nchwc_winograd` with transformed weights for one of
    ``winograd_calls`` (with its tile), :func:`conv2d_nchwc_dot` with packed weights for one
    that fits a dot-product instruction (bf16, uint8 x int8; :func:`dot_elements`), its data
    padded outside its function where the data's dtype is in ``pad_apart``
    (:data:`PAD_APART`) and then in the block ``wide`` gives for its dtype where the
    input channels fill it (:func:`wide_blocks`; a stride-1 1x1 conv too where its data is
    in ``sole_reader``, variables the conv alone reads), :func:`depthwise_conv2d_nchwc` for a
    blocked depthwise one, :func:`group_conv2d_nchwc` for another blocked grouped one; TVM's
    own legalization otherwise."""
    attrs = call.attrs
    if block_of(str(attrs.data_layout)) is None:
        return relax.transform.legalize_ops.nn._nn_conv2d(bb, call)
    out = out_dtype(call)
    tile = next((m for c, m in winograd_calls if c.same_as(call)), None)
    weight = _constant(bb, call.args[1])
    if tile is not None and weight is not None:
        from tuner.graph.winograd import DOT_TILE, conv2d_nchwc_winograd, transform_weight, transform_weight_dot

        w = weight.value.numpy().astype(np.float32)
        if tile == DOT_TILE and str(weight.ty.dtype) == "bfloat16":
            # A bf16 model's F(2, 3): GEMMs on vdpbf16ps, weights transformed and rounded to bf16.
            packed = relax.const(transform_weight_dot(w, tile), "bfloat16")
        else:
            # float32: a bf16 model's F(4, 3) weights are transformed from their bf16 values
            # and not rounded again (tuner.graph.winograd).
            packed = relax.const(transform_weight(w, tile), "float32")
        return bb.call_te(conv2d_nchwc_winograd, call.args[0], packed, [int(p) for p in attrs.padding], tile,
                          out, primfunc_name_hint="conv2d_NCHWc_winograd")  # fmt: skip
    kernel_shape = [int(d) for d in call.args[1].ty.shape.values]
    if int(attrs.groups) != 1 and kernel_shape[1] * kernel_shape[4] != 1:
        # A grouped conv that is not depthwise (plan.grouped_fits): weights re-packed per block.
        if weight is None:
            raise ValueError("a blocked grouped conv needs constant weights (plan.grouped_fits)")
        packed = pack_group_weight(unblock_weight(weight.value.numpy()), int(attrs.groups), kernel_shape[5])
        return bb.call_te(
            group_conv2d_nchwc, call.args[0], relax.const(packed, str(weight.ty.dtype)),
            [int(s) for s in attrs.strides], [int(p) for p in attrs.padding], [int(d) for d in attrs.dilation], out,
            primfunc_name_hint="conv2d_NCHWc_grouped",
        )
    if int(attrs.groups) != 1:
        return bb.call_te(
            depthwise_conv2d_nchwc, call.args[0], call.args[1], [int(s) for s in attrs.strides],
            [int(p) for p in attrs.padding], [int(d) for d in attrs.dilation], out,
            primfunc_name_hint="depthwise_conv2d_NCHWc",
        )
    data = call.args[0]
    block = (wide or {}).get(str(data.ty.dtype))
    if (weight is not None and str(data.ty.dtype) == str(weight.ty.dtype) == "bfloat16"
            and row_taps_fit(weight.ty.shape.values, block) and all(int(d) == 1 for d in attrs.dilation)):
        # A conv of few channels (an RGB stem) reads a kernel row's taps as one block: the
        # row_taps copy takes the padding's place, outside the conv's function. Not uint8: its
        # 64-byte block holds 16 slots a channel for 7 taps, and the quantize that writes
        # them took 0.68 ms in ResNet-50's int8 job, against 0.48 for the stem and its input
        # function without (twenty-eighth session, an AMX Xeon).
        from search_spaces.x86.intrin import BF16_DOT

        taps = bb.emit_te(row_taps, data, [int(p) for p in attrs.padding], int(weight.ty.shape.values[3]),
                          int(attrs.strides[1]), block, primfunc_name_hint="row_taps")  # fmt: skip
        packed = relax.const(pack_dot_weight(row_tap_weight(weight.value.numpy(), block), BF16_DOT.elements),
                             "bfloat16")  # fmt: skip
        return bb.call_te(conv2d_nchwc_dot, taps, packed, [int(attrs.strides[0]), 1], [0, 0, 0, 0],
                          [int(attrs.dilation[0]), 1], out, primfunc_name_hint="conv2d_NCHWc_dot")  # fmt: skip
    n = dot_elements(call, weight)
    if n is not None and weight is not None:
        w = weight.value.numpy()
        padding, strides = [int(p) for p in attrs.padding], [int(s) for s in attrs.strides]
        widens = _widens(w.shape, block)
        # A stride-1 1x1 conv on AMX whose data nothing else reads (ResNet's expansion conv
        # after the 3x3) takes it in wide blocks, written so by the producer as a padded input
        # is. Where the data has other readers (a block's input, which the residual reads
        # too) a copy would cost a pass over it: those keep their 16-channel block.
        sole_1x1 = (widens and w.shape[2:4] == (1, 1) and max(strides) == 1 and not any(padding)
                    and data in sole_reader)  # fmt: skip
        if str(data.ty.dtype) in pad_apart and (any(padding) or sole_1x1):
            # The conv reads data padded outside its function: a copy into the padded shape,
            # which tuner.graph.pad_fusion moves into the data's producer (PAD_APART says why), in
            # wide blocks on AMX (wide_blocks).
            data, padding = emit_padded(bb, data, padding, block if widens else None), [0, 0, 0, 0]
            w = widen_weight(w, block) if widens else w
        elif widens and w.shape[2:4] == (1, 1) and not any(padding) and (
                max(strides) > 1 or block // int(w.shape[4]) >= SHARED_COPY_GAIN):
            # A strided 1x1 conv (ResNet's downsampling) on AMX: a copy of the pixels it reads,
            # in wide blocks, then stride 1. So does a stride-1 one whose data others read
            # too (a block's input, which the residual reads) where the wide block saves it
            # SHARED_COPY_GAIN times the tile multiplies or more.
            data, strides, w = emit_subsampled(bb, data, strides, block), [1, 1], widen_weight(w, block)
        packed = relax.const(pack_dot_weight(w, n), str(weight.ty.dtype))
        return bb.call_te(conv2d_nchwc_dot, data, packed, strides, padding,
                          [int(d) for d in attrs.dilation], out,
                          primfunc_name_hint="conv2d_NCHWc_dot")  # fmt: skip
    return bb.call_te(
        topi.nn.conv2d_NCHWc, call.args[0], call.args[1],
        [int(s) for s in attrs.strides], [int(p) for p in attrs.padding], [int(d) for d in attrs.dilation],
        str(attrs.data_layout), str(attrs.out_layout), out,
        primfunc_name_hint="conv2d_NCHWc",
    )  # fmt: skip


def _legalize_matmul(lanes: int) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    """A float32 matmul by a constant ``[K, N]`` weight (every dense layer) reads the weight
    packed (:func:`pack_dense_weight`, converted once, now); other matmuls legalize as TVM
    does. Row-major, a tile's K steps are a row of the weight apart (12 KiB in BERT's FFN);
    packed, they are adjacent. On BERT-base's dense shapes the best of 16 x86-dense points
    took 1-7% less time packed than row-major (copying panels at run time or not), and the
    same tile 16-39% less than copying its panels at run time (benchmarks/dense_packing.py).
    A weight whose columns come close to whole blocks is padded to them with zeros
    (:func:`padded_columns`), and a ``strided_slice`` in an injective function of its own
    drops the padding columns from the output, as the bf16 path's padded classifier does
    (``FuseOps`` fuses no injective consumer into the matmul, whose epilogue must be
    elementwise over its own output for the x86-dense template)."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        weight = _constant(bb, call.args[1])
        shape = _static_shape(call.args[0])
        out_dtype = str(call.attrs.out_dtype) if call.attrs.out_dtype not in (None, "", "void") else "float32"
        columns = None
        if (weight is not None and len(weight.ty.shape.values) == 2 and shape is not None and len(shape) >= 2
                and str(weight.ty.dtype) == str(call.args[0].ty.dtype) == out_dtype == "float32"):  # fmt: skip
            n = int(weight.ty.shape.values[1])
            columns = n if dense_block(n, lanes) else padded_columns(n, lanes)
        if weight is None or columns is None:
            return relax.transform.legalize_ops.linear_algebra._matmul(bb, call)
        w = weight.value.numpy()
        w = np.pad(w, ((0, 0), (0, columns - w.shape[1])))
        packed = relax.const(pack_dense_weight(w, dense_block(columns, lanes)), "float32")
        out = bb.call_te(matmul_packed, call.args[0], packed, primfunc_name_hint="matmul")
        if columns == n:
            return out
        return bb.call_te(topi.strided_slice, bb.emit(out), [0], [n], [1], axes=[len(shape) - 1],
                          primfunc_name_hint="first_columns", primfunc_attrs={"op_pattern": INJECTIVE})  # fmt: skip

    return legalize


def _static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return tuple(int(d) for d in values)


#: The data dtypes whose dot-product convs read their input padded by another function.
#: bfloat16: TVM computes on bfloat16 buffers that a function allocates in float32
#: (``BF16ComputeLegalize``), so a padded copy made inside the conv's function could not
#: feed ``vdpbf16ps``. uint8 too: a uint8 conv (zero point 0, so the border is 0) would
#: otherwise pad in a pass of its own inside its function, which reads the producer's output
#: back and writes it again; apart, :func:`tuner.graph.pad_fusion.fold_pad_into_producer` has the
#: producer store each tile into the padded buffer (in the wide block of an AMX conv's
#: input, :func:`wide_blocks`).
PAD_APART = ("bfloat16", "uint8")


#: How many times fewer tile multiplies a wide block must give a stride-1 1x1 conv whose data
#: others read too (ResNet's convs that read a block's input) for it to read a wide copy:
#: uint8's 64 channels against 16 (4x) pay for the copy, a pass over the data; bfloat16's 32
#: (2x) are not taken. On an Emerald Rapids, ResNet-50 int8's such convs ran at 1.6-3.6x
#: the per-node times of OpenVINO on the QDQ file (``INFERENCE_PRECISION_HINT`` f32, so its
#: int8 kernels and not its bf16 default) on 16-channel blocks; with the copies the model
#: took 0.872x the time (benchmarks/README.md, thirty-sixth session).
SHARED_COPY_GAIN = 4


def _legalize_layout_transform(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A layout transform without padding as a gather, each output element read from its
    source, which ``AnnotateTIROpPattern`` sees as injective so ``FuseOps`` fuses it with the
    casts and pads beside it.

    TVM's own legalization writes each input element to its place (``transform_layout`` on
    the write), an opaque function that nothing fuses with: bf16 ResNet-50 ran its input
    through cast + channel pad, this transform and a spatial pad, three functions where one
    pass over the image does.
    """
    index_map, data = call.attrs.index_map, call.args[0]
    shape = list(data.ty.shape)
    inverse, padding = index_map.non_surjective_inverse(shape)
    if not (isinstance(padding, tvm.tirx.IntImm) and not padding.value):
        return relax.transform.legalize_ops.manipulate._layout_transform(bb, call)

    def gather(x: te.Tensor) -> te.Tensor:
        return te.compute(index_map.map_shape(shape), lambda *i: x(*inverse.map_indices(list(i))), name="T_layout")

    return bb.call_te(gather, data, primfunc_name_hint="layout_transform")


def _legalize_gelu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """GELU with TOPI's ``fast_erf`` (a float32 rational approximation, ~1e-7 relative error).

    TVM's own legalization calls ``erf``, which LLVM lowers to a scalar ``erff`` call per
    element: in BERT's FFN matmul + GELU task that held the register-tiled template at 151
    GFLOPS against 259 without GELU (benchmarks/op_ceiling.py).
    """
    if str(call.args[0].ty.dtype) != "float32":
        return relax.transform.legalize_ops.nn._nn_gelu(bb, call)

    def te_gelu(x):
        half = tvm.tirx.const(0.5, "float32")
        return x * (half + topi.fast_erf(x * tvm.tirx.const(0.5**0.5, "float32")) * half)

    return bb.call_te(te_gelu, call.args[0], primfunc_name_hint="gelu")


def _legalize_erf(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``erf`` with TOPI's ``fast_erf``, as :func:`_legalize_gelu`: ONNX models write GELU as
    ``x * 0.5 * (1 + erf(x / sqrt(2)))``, and TVM's own ``erf`` is a scalar ``erff`` call per
    element, which dominated the ONNX BERT FFN matmul + GELU task it was fused into."""
    if str(call.args[0].ty.dtype) != "float32":
        return relax.transform.legalize_ops.unary._erf(bb, call)
    return bb.call_te(topi.fast_erf, call.args[0], primfunc_name_hint="erf")


def _float32(call: relax.Call) -> bool:
    return str(call.args[0].ty.dtype) == "float32"


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """``1 / (1 + exp(-x))`` on TOPI's ``fast_exp`` (its input clamped to +-88: 0 and 1 at the ends)."""
    e = topi.fast_exp(topi.negative(x))
    one = tvm.tirx.const(1.0, "float32")
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="sigmoid", tag=topi.tag.ELEMWISE)


def _legalize_tanh(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``tanh`` with TOPI's ``fast_tanh`` (a float32 rational approximation). TVM's own
    ``tanh`` on LLVM is two scalar ``expf`` calls per element: GPT-2's GELU (tanh form, written
    out by the model) took 42 of its 164 ms
    (``benchmarks/archive/results/op_profile_gpt2_before_fast_math_znver4.json``)."""
    if not _float32(call):
        return relax.transform.legalize_ops.unary._call_topi_without_attr(topi.tanh, "tir_tanh")(bb, call)
    return bb.call_te(topi.fast_tanh, call.args[0], primfunc_name_hint="tanh")


def _legalize_sigmoid(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``sigmoid`` on ``fast_exp`` (SiLU/swish and squeeze-excitation gates), as :func:`_legalize_tanh`."""
    if not _float32(call):
        return relax.transform.legalize_ops.unary._call_topi_without_attr(topi.sigmoid, "tir_sigmoid")(bb, call)
    return bb.call_te(_fast_sigmoid, call.args[0], primfunc_name_hint="sigmoid")


def _legalize_silu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``silu`` (``x * sigmoid(x)``) on :func:`_fast_sigmoid`."""
    if not _float32(call):
        return relax.transform.legalize_ops.nn._nn_silu(bb, call)
    return bb.call_te(lambda x: topi.multiply(x, _fast_sigmoid(x)), call.args[0], primfunc_name_hint="silu")


def _legalize_gelu_tanh(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """GELU's tanh form on ``fast_tanh``, with ``x**3`` as two multiplies."""
    if not _float32(call):
        return relax.transform.legalize_ops.nn._nn_gelu_tanh(bb, call)

    def te_gelu_tanh(x: te.Tensor) -> te.Tensor:
        c = [tvm.tirx.const(v, "float32") for v in (0.5, (2 / np.pi) ** 0.5, 0.044715, 1.0)]
        inner = te.compute(x.shape, lambda *i: c[1] * (x(*i) + c[2] * x(*i) * x(*i) * x(*i)), name="gelu_inner")
        t = topi.fast_tanh(inner)
        return te.compute(x.shape, lambda *i: c[0] * x(*i) * (c[3] + t(*i)), name="gelu_tanh", tag=topi.tag.ELEMWISE)

    return bb.call_te(te_gelu_tanh, call.args[0], primfunc_name_hint="gelu_tanh")


#: Integer exponents that ``power`` computes by multiplying (GELU's tanh form cubes its input).
POWER_BY_MULTIPLY = (2, 3, 4)


def _legalize_power(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``power(x, n)`` for a constant ``n`` in :data:`POWER_BY_MULTIPLY` as ``n - 1`` multiplies;
    TVM's own is a scalar ``powf`` call per element."""
    base, exponent = call.args
    value = exponent.value.numpy() if isinstance(exponent, tvm.ir.expr.Constant) else None
    if (not _float32(call) or value is None or value.size != 1 or float(value.flat[0]) not in POWER_BY_MULTIPLY
            or _static_shape(call) != _static_shape(base)):  # fmt: skip
        return relax.transform.legalize_ops.binary._binary(topi.power)(bb, call)
    n = int(value.flat[0])

    def te_power(x: te.Tensor) -> te.Tensor:
        def product(*i):
            out = x(*i)
            for _ in range(n - 1):
                out = out * x(*i)
            return out

        return te.compute(x.shape, product, name="power", tag=topi.tag.ELEMWISE)

    return bb.call_te(te_power, base, primfunc_name_hint="power")


def _legalize_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """softmax with TOPI's ``fast_exp`` (a float32 polynomial; within 1e-5 of the exact softmax,
    tests/tuner/test_layout.py), as :func:`_legalize_gelu` does for ``erf``. BERT-base's tuned
    softmax ran at 5x ONNX Runtime's (``results/op_profile_bert-base.json``); TVM's own ``exp``
    has no vector form on x86. Over the last axis, each row's sum is inverted once and the
    exponentials multiplied by it (:func:`fast_softmax_last_axis`)."""
    if str(call.args[0].ty.dtype) != "float32":
        return relax.transform.legalize_ops.nn._nn_softmax(bb, call)
    axis, ndim = int(call.attrs.axis), len(call.args[0].ty.shape)
    if axis in (-1, ndim - 1):
        return bb.call_te(fast_softmax_last_axis, call.args[0], primfunc_name_hint="softmax")
    return bb.call_te(topi.nn.fast_softmax, call.args[0], axis, primfunc_name_hint="softmax")


#: The CPU legalizations of elementwise math that TVM lowers to scalar libm calls.
FAST_MATH: dict[str, Callable[[relax.BlockBuilder, relax.Call], relax.Expr]] = {
    "relax.nn.gelu": _legalize_gelu,
    "relax.nn.gelu_tanh": _legalize_gelu_tanh,
    "relax.erf": _legalize_erf,
    "relax.tanh": _legalize_tanh,
    "relax.sigmoid": _legalize_sigmoid,
    "relax.nn.silu": _legalize_silu,
    "relax.power": _legalize_power,
}
