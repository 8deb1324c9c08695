"""Tasks and spaces shared by the search-space tests.

Every space kind (``search_spaces.kinds()``: the sketch space and each registered template)
is paired with every test task it applies to; the conformance suite runs over all pairs, so
registering a template adds it to the suite.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import tvm
from tvm import te, topi

# As a user's package would: register its own template; the suite then covers it too.
from user_templates import USER_GEMM

import search_spaces
from search_spaces import Point, SearchSpace
from tuner.device import host_cpu_info

search_spaces.register_template(USER_GEMM, replace=True)


def matmul(n: int = 64) -> tvm.IRModule:
    """C = A @ B, square."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def conv_bias_relu() -> tvm.IRModule:
    """A small ResNet-style 3x3 conv (pad 1) + bias + relu, as TOPI writes it."""
    data = te.placeholder((1, 16, 14, 14), name="data")
    weight = te.placeholder((32, 16, 3, 3), name="weight")
    bias = te.placeholder((1, 32, 1, 1), name="bias")
    conv = topi.nn.conv2d_nchw(data, weight, stride=1, padding=1, dilation=1)
    out = topi.nn.relu(topi.add(conv, bias))
    return tvm.IRModule({"main": te.create_prim_func([data, weight, bias, out])})


def conv_nchwc(c: int = 32, hw: int = 14, o: int = 32, k: int = 3, stride: int = 1, pad: int = 1,
               ic_block: int = 16, oc_block: int = 16, *, epilogue: bool = True) -> tvm.IRModule:
    """A conv in the blocked NCHW[x]c layout + bias + relu, as the layout pass emits it
    (without ``epilogue``, the bare conv)."""
    data = te.placeholder((1, c // ic_block, hw, hw, ic_block), name="data")
    kernel = te.placeholder((o // oc_block, c // ic_block, k, k, ic_block, oc_block), name="kernel")
    bias = te.placeholder((1, o // oc_block, 1, 1, oc_block), name="bias")
    with tvm.target.Target({"kind": "llvm"}):  # conv2d_NCHWc asks for a current target
        conv = topi.nn.conv2d_NCHWc(data, kernel, stride, pad, 1, layout=f"NCHW{ic_block}c",
                                    out_layout=f"NCHW{oc_block}c")
    if not epilogue:
        return tvm.IRModule({"main": te.create_prim_func([data, kernel, conv])})
    out = topi.nn.relu(topi.add(conv, bias))
    return tvm.IRModule({"main": te.create_prim_func([data, kernel, bias, out])})


def _extracted(x_shape: tuple[int, ...], layer: Callable, name: str | tuple[str, ...], precision: str = "fp32",
               ) -> tvm.IRModule:  # fmt: skip
    """The task whose name holds ``name`` (each of several) of a one-layer Relax model
    ``layer(x)``, as ``tune`` extracts it (the host's layouts, int64 indices, the epilogue
    fused) at ``precision``."""
    from tvm import relax

    from tuner.graph.tasks import extract_tasks

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(layer(x)))
        bb.emit_func_output(out)
    parts = (name,) if isinstance(name, str) else name
    [found] = [t for t in extract_tasks(bb.get(), target("llvm"), precision=precision)
               if all(part in t.name for part in parts)]  # fmt: skip
    return found.mod


def _const(*shape: int) -> tvm.relax.Constant:
    import numpy as np

    return tvm.relax.const(np.random.default_rng(0).standard_normal(shape, dtype="float32"))


def conv_nchwc_relax(precision: str = "fp32") -> tvm.IRModule:
    """A conv + bias + relu as ``tune`` extracts it (NCHW[x]c at the host's vector width):
    32 -> 32 channels, 3x3, 14x14; in bf16, NCHW16c on the dot-product instruction."""
    op = tvm.relax.op
    return _extracted((1, 32, 14, 14), lambda x: op.nn.relu(op.add(op.nn.conv2d(x, _const(32, 32, 3, 3), padding=1),
                                                                   _const(1, 32, 1, 1))), "conv2d_NCHWc", precision)


def conv_padded_output_bf16() -> tvm.IRModule:
    """A bf16 conv 1x1 + bias + relu whose output a conv 3x3 (pad 1) reads, as ``tune``
    extracts it: the function ends by copying each tile into the padded shape
    (``tuner.graph.pad_fusion``); the copy's offset is what a candidate must get right."""
    op = tvm.relax.op
    return _extracted((1, 32, 14, 14), lambda x: op.nn.conv2d(
        op.nn.relu(op.add(op.nn.conv2d(x, _const(32, 32, 1, 1)), _const(1, 32, 1, 1))), _const(32, 32, 3, 3),
        padding=1), ("conv2d", "pad_NCHWc"), "bf16")  # fmt: skip


def conv_padded_output_u8() -> tvm.IRModule:
    """The int8 counterpart of :func:`conv_padded_output_bf16`, as ``tune`` extracts it from
    a QDQ graph: a uint8 x int8 conv 1x1 (input quantized with zero point 0) + requantize +
    relu + quantize, whose uint8 output a conv 3x3 (pad 1) reads; the function ends by
    copying each tile into the padded shape (``tuner.graph.pad_fusion``)."""
    import numpy as np

    op = tvm.relax.op
    rng = np.random.default_rng(3)

    def qdq(x: tvm.relax.Expr, scale: float) -> tvm.relax.Expr:
        args = (tvm.relax.const(scale, "float32"), tvm.relax.const(0, "uint8"))
        return op.dequantize(op.quantize(x, *args, out_dtype="uint8"), *args, out_dtype="float32")

    def weight(*shape: int) -> tvm.relax.Constant:
        # int8 values x a per-channel scale, as quantize_static writes them (127 the peak)
        q = rng.integers(-127, 128, shape).astype(np.float32)
        q[:, 0, 0, 0] = 127
        return tvm.relax.const(q * rng.uniform(1e-3, 4e-3, (shape[0], 1, 1, 1)).astype(np.float32))

    def layer(x: tvm.relax.Expr) -> tvm.relax.Expr:
        y = op.nn.relu(op.add(op.nn.conv2d(qdq(x, 1 / 255), weight(32, 32, 1, 1)), _const(1, 32, 1, 1)))
        return op.nn.conv2d(qdq(y, 0.02), weight(32, 32, 3, 3), padding=1)

    return _extracted((1, 32, 14, 14), layer, ("conv2d", "pad_NCHWc"), "int8")


def dense_relax(precision: str = "fp32") -> tvm.IRModule:
    """A dense layer + bias + relu as ``tune`` extracts it (the weight packed): 46 rows, 64 -> 64;
    in bf16, on the dot-product instruction."""
    op = tvm.relax.op
    return _extracted((1, 46, 64), lambda x: op.nn.relu(op.add(op.matmul(x, _const(64, 64)), _const(64))), "matmul",
                      precision)


def conv_nchwc_first() -> tvm.IRModule:
    """ResNet's first conv, smaller: 7x7 stride 2 over 3 input channels (channel block 3)."""
    return conv_nchwc(c=3, hw=32, o=16, k=7, stride=2, pad=3, ic_block=3)


def dense(batch: tuple[int, ...] = (1,), m: int = 32, k: int = 64, n: int = 48, *,
          batched_b: bool = False, epilogue: bool = True) -> tvm.IRModule:
    """A matmul as Relax legalizes it (block ``matmul``), + bias + relu (without
    ``epilogue``, the bare matmul); B is a weight (k, n), or with ``batched_b`` a batched
    operand as in attention."""
    a = te.placeholder((*batch, m, k), name="A")
    b = te.placeholder((*batch, k, n) if batched_b else (k, n), name="B")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="k")

    def body(*idx):
        *bi, i, j = idx
        return te.sum(a[(*bi, i, r)] * (b[(*bi, r, j)] if batched_b else b[r, j]), axis=r)

    c = te.compute((*batch, m, n), body, name="matmul")
    if not epilogue:
        return tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    out = topi.nn.relu(topi.add(c, bias))
    return tvm.IRModule({"main": te.create_prim_func([a, b, bias, out])})


def dense_packed(m: int = 32, k: int = 64, n: int = 64, block: int = 32) -> tvm.IRModule:
    """A dense layer as ``tuner.graph.layout`` legalizes it on CPUs: the weight packed [n/block, k,
    block] (block ``matmul``), + bias + relu."""
    from tuner.graph.layout.ops import matmul_packed

    a = te.placeholder((1, m, k), name="A")
    w = te.placeholder((n // block, k, block), name="W")
    bias = te.placeholder((n,), name="bias")
    out = topi.nn.relu(topi.add(matmul_packed(a, w), bias))
    return tvm.IRModule({"main": te.create_prim_func([a, w, bias, out])})


def batch_matmul() -> tvm.IRModule:
    """Attention's context, smaller: 2 heads of (16 x 32) @ (32 x 32), no epilogue."""
    return dense((1, 2), 16, 32, 32, batched_b=True, epilogue=False)


def conv_nchwc_bare() -> tvm.IRModule:
    """A stride-2 1x1 NCHW16c conv with nothing after it (the downsampling shortcut)."""
    return conv_nchwc(c=32, hw=14, o=32, k=1, stride=2, pad=0, epilogue=False)


def depthwise(stride: int = 1) -> tvm.IRModule:
    """A MobileNet depthwise 3x3 conv (pad 1) + bias + relu, as Relax legalizes it."""
    data = te.placeholder((1, 16, 14, 14), name="data")
    weight = te.placeholder((16, 1, 3, 3), name="weight")
    bias = te.placeholder((1, 16, 1, 1), name="bias")
    conv = topi.nn.group_conv2d_nchw(data, weight, stride, 1, 1, 16)
    out = topi.nn.relu(topi.add(conv, bias))
    return tvm.IRModule({"main": te.create_prim_func([data, weight, bias, out])})


def depthwise_nchwc(stride: int = 1, block: int = 8, channels: int = 32) -> tvm.IRModule:
    """The same depthwise conv in the blocked layout, as ``tuner.graph.layout`` legalizes it for an
    NCHW{block}c plan (block ``depthwise_conv2d_NCHWc``), + bias + relu."""
    from tuner.graph.layout.ops import depthwise_conv2d_nchwc

    chunks = channels // block
    data = te.placeholder((1, chunks, 14, 14, block), name="data")
    weight = te.placeholder((chunks, 1, 3, 3, 1, block), name="weight")
    bias = te.placeholder((1, chunks, 1, 1, block), name="bias")
    conv = depthwise_conv2d_nchwc(data, weight, (stride, stride), (1, 1, 1, 1), (1, 1), "float32")
    out = topi.nn.relu(topi.add(conv, bias))
    return tvm.IRModule({"main": te.create_prim_func([data, weight, bias, out])})


def group_conv_nchwc(per_group: int = 4, block: int = 8, channels: int = 32, stride: int = 1) -> tvm.IRModule:
    """A grouped 3x3 conv (pad 1, as many input as output channels; ResNeXt's) in the blocked
    layout, as ``tuner.graph.layout`` legalizes it (block ``conv2d_NCHWc_grouped``, weights
    packed per block), + bias + relu."""
    from tuner.graph.layout.ops import group_conv2d_nchwc

    chunks, m = channels // block, max(per_group // block, 1)
    data = te.placeholder((1, chunks, 14, 14, block), name="data")
    weight = te.placeholder((chunks, m, 3, 3, block, block), name="weight")
    bias = te.placeholder((1, chunks, 1, 1, block), name="bias")
    conv = group_conv2d_nchwc(data, weight, (stride, stride), (1, 1, 1, 1), (1, 1), "float32")
    out = topi.nn.relu(topi.add(conv, bias))
    return tvm.IRModule({"main": te.create_prim_func([data, weight, bias, out])})


def separable_resize() -> tvm.IRModule:
    """A segmentation head's bilinear upsampling (5 x 9 x 9 to 5 x 40 x 40) as
    ``tuner.graph.separable_resize`` legalizes it: a width pass, then the height pass."""
    from tuner.graph.separable_resize import _tables, separable_resize2d

    data = te.placeholder((1, 5, 9, 9), name="data")
    tables = [*_tables(9, 40, "half_pixel"), *_tables(9, 40, "half_pixel")]
    args = [te.placeholder(t.value.numpy().shape, str(t.value.dtype), name=f"table{i}")
            for i, t in enumerate(tables)]  # fmt: skip
    out = separable_resize2d(data, *args, width_first=True)
    return tvm.IRModule({"main": te.create_prim_func([data, *args, out])})


def dense_bf16(m: int = 32, k: int = 64, n: int = 48) -> tvm.IRModule:
    """A bf16 dense layer as ``tuner.precision.bf16`` writes it (block ``matmul_bf16``,
    weight packed [n/b, k/2, b, 2], float32 accumulation) + bias + relu."""
    from tuner.precision.bf16 import packed_matmul, packed_shape

    a = te.placeholder((1, m, k), name="A", dtype="bfloat16")
    w = te.placeholder(packed_shape(k, n), name="W", dtype="bfloat16")
    bias = te.placeholder((n,), name="bias")
    out = topi.nn.relu(topi.add(packed_matmul(a, w), bias))
    return tvm.IRModule({"main": te.create_prim_func([a, w, bias, out])})


def attention_bf16(heads: int = 2, m: int = 32, k: int = 64, n: int = 48) -> tvm.IRModule:
    """An attention matmul as ``tuner.precision.bf16`` writes it: two activations, the second
    packed [heads, n/b, k/2, b, 2] like a weight (block ``matmul_bf16``), x a scale."""
    from tuner.precision.bf16 import packed_matmul, packed_shape

    a = te.placeholder((1, heads, m, k), name="A", dtype="bfloat16")
    w = te.placeholder((1, heads, *packed_shape(k, n)), name="W", dtype="bfloat16")
    out = topi.multiply(packed_matmul(a, w), 0.125)
    return tvm.IRModule({"main": te.create_prim_func([a, w, out])})


def dense_u8s8(m: int = 32, k: int = 64, n: int = 48) -> tvm.IRModule:
    """An int8 dense layer as ``tuner.precision.qdq`` writes it (block ``matmul_u8s8``, uint8
    x int8 weight packed [n/b, k/4, b, 4], int32 sums), - zero point x column sums, requantized."""
    from tuner.precision.bf16 import packed_matmul, packed_shape
    from tuner.precision.qdq import INT8_MATMUL

    a = te.placeholder((1, m, k), name="A", dtype="uint8")
    w = te.placeholder(packed_shape(k, n, 4), name="W", dtype="int8")
    correction = te.placeholder((n,), name="correction", dtype="int32")
    acc = topi.subtract(packed_matmul(a, w, "int32", INT8_MATMUL), correction)
    out = topi.cast(topi.clip(topi.round(topi.multiply(topi.cast(acc, "float32"), 0.01)), 0, 255), "uint8")
    return tvm.IRModule({"main": te.create_prim_func([a, w, correction, out])})


def conv_nchwc_dot(dtype: str = "bfloat16", stride: int = 1, residual: bool = False, channels: int = 32,
                   block: int = 16, lanes: int = 16) -> tvm.IRModule:  # fmt: skip
    """A 3x3 conv (pad 1), 32 -> ``channels`` channels, in NCHW16c as ``tuner.graph.layout``
    legalizes one that fits a dot-product instruction: ``conv2d_NCHWc_dot`` with weights
    ``OIHW{16/n}i16o{n}i``, bfloat16 (n 2, float32 sums) or uint8 x int8 (n 4, int32 sums),
    + bias + relu; ``residual`` adds a dequantized input computed before the conv, as int8
    ResNets fuse it. A ``block`` above 16 reads ``block`` input channels (64 for uint8) in
    one chunk, already padded: the wide block of an AMX target (``tuner.graph.layout.plan.wide_blocks``).
    ``lanes`` 8: AVX2's blocks (NCHW8c, 8 output channels a weight vector)."""
    from tuner.graph.layout.ops import conv2d_nchwc_dot

    n = 2 if dtype == "bfloat16" else 4
    acc = "float32" if dtype == "bfloat16" else "int32"
    # bfloat16 data comes padded by a function of its own (see tuner.graph.layout.legalize._legalize_conv2d).
    pad = 0 if n == 2 or block > 16 else 1
    block = min(block, lanes) if block == 16 else block
    chunks = max(32, block) // block
    data = te.placeholder((1, chunks, 16 - 2 * pad, 16 - 2 * pad, block), name="data", dtype=dtype)
    weight = te.placeholder((channels // lanes, chunks, 3, 3, block // n, lanes, n), name="weight",
                            dtype=dtype if n == 2 else "int8")  # fmt: skip
    bias = te.placeholder((1, channels // lanes, 1, 1, lanes), name="bias")
    conv = conv2d_nchwc_dot(data, weight, (stride, stride), (pad,) * 4, (1, 1), acc)
    out = topi.add(topi.cast(conv, "float32") if acc != "float32" else conv, bias)
    args = [data, weight, bias]
    if residual:
        oh = 14 // stride
        skip = te.placeholder((1, channels // lanes, oh, oh, lanes), name="skip", dtype="uint8")
        out = topi.add(out, topi.multiply(topi.cast(skip, "float32"), 0.05))
        args.append(skip)
    out = topi.nn.relu(out)
    return tvm.IRModule({"main": te.create_prim_func([*args, out])})


def row_taps(h: int = 20, w: int = 22) -> tvm.IRModule:
    """What an AMX stem reads (``tuner.graph.layout.ops.row_taps``), as ResNet-50 bf16's task makes it:
    a float32 image of 3 channels cast to bfloat16, given a fourth, zero channel and laid
    out NCHW4c, then copied into rows of 7 taps (pad 3, stride 2) in blocks of 32."""
    from tuner.graph.layout.ops import row_taps as taps

    x = te.placeholder((1, 3, h, w), name="x")
    cast = topi.cast(x, "bfloat16")
    four = te.compute((1, 4, h, w), lambda n, c, i, j: tvm.tirx.if_then_else(
        c < 3, cast[n, tvm.tirx.min(c, 2), i, j], tvm.tirx.const(0, "bfloat16")), name="PadInput")
    blocked = te.compute((1, 1, h, w, 4), lambda n, c, i, j, b: four[n, c * 4 + b, i, j], name="T_layout")
    return tvm.IRModule({"main": te.create_prim_func([x, taps(blocked, (3, 3, 3, 3), 7, 2, 32)])})


def conv_winograd(c: int = 32, hw: int = 14, o: int = 32, m: int = 4, block: int = 16, *,
                  epilogue: bool = True, dtype: str = "float32", dot: bool = False) -> tvm.IRModule:
    """A 3x3 conv (pad 1) by Winograd F(m, 3) in NCHW{block}c, as ``tuner.graph.layout`` legalizes
    one under an ``NCHW{block}c:w{m}`` plan (weights transformed), + bias + relu (without
    ``epilogue``, the bare conv). ``dtype`` bfloat16: a bf16 model's, its data and output
    (the epilogue's cast) bf16, the weights float32, or with ``dot`` bf16 pairs for
    ``vdpbf16ps`` (``tuner.graph.winograd.transform_weight_dot``)."""
    from tuner.graph.winograd import DOT_PAIR, conv2d_nchwc_winograd

    data = te.placeholder((1, c // block, hw, hw, block), name="data", dtype=dtype)
    if dot:
        kernel = te.placeholder((m + 2, m + 2, o // block, c // DOT_PAIR, block, DOT_PAIR), name="kernel",
                                dtype="bfloat16")  # fmt: skip
    else:
        kernel = te.placeholder((m + 2, m + 2, o // block, c, block), name="kernel")
    conv = conv2d_nchwc_winograd(data, kernel, (1, 1, 1, 1), m)
    if not epilogue:
        return tvm.IRModule({"main": te.create_prim_func([data, kernel, conv])})
    bias = te.placeholder((1, o // block, 1, 1, block), name="bias")
    out = topi.nn.relu(topi.add(conv, bias))
    if dtype != "float32":
        out = topi.cast(out, dtype)
    return tvm.IRModule({"main": te.create_prim_func([data, kernel, bias, out])})


def softmax(axis: int = -1) -> tvm.IRModule:
    """A softmax over ``axis`` times a per-column scale, as ``tune`` extracts it
    (``fast_softmax``, the multiply fused after it): 4 x 32 rows of 64."""
    op = tvm.relax.op
    return _extracted((1, 4, 32, 64), lambda x: op.multiply(op.nn.softmax(x, axis=axis), _const(64)), "softmax")


def layer_norm(axis: int = -1) -> tvm.IRModule:
    """A layer norm over ``axis`` times a per-column scale, as ``tune`` extracts it: 8 rows of 64."""
    op = tvm.relax.op
    return _extracted((1, 8, 64), lambda x: op.multiply(op.nn.layer_norm(x, _const(64) if axis == -1 else _const(8),
                                                                         _const(64) if axis == -1 else _const(8),
                                                                         axes=[axis]), _const(64)), "layer_norm")


def relu() -> tvm.IRModule:
    """An elementwise op small enough that its whole space can be enumerated."""
    x = te.placeholder((4, 8), name="x")
    y = topi.nn.relu(x)
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


TASKS: dict[str, Callable[[], tvm.IRModule]] = {
    "matmul": matmul, "conv": conv_bias_relu, "relu": relu, "conv_nchwc": conv_nchwc, "softmax": softmax,
    "softmax_axis1": lambda: softmax(axis=1), "layer_norm": layer_norm, "layer_norm_axis1": lambda: layer_norm(1),
    "conv_nchwc_first": conv_nchwc_first, "conv_nchwc_bare": conv_nchwc_bare, "dense": dense,
    "conv_nchwc_relax": conv_nchwc_relax, "dense_relax": dense_relax,
    "conv_nchwc_bf16_relax": lambda: conv_nchwc_relax("bf16"), "dense_bf16_relax": lambda: dense_relax("bf16"),
    "dense_packed": dense_packed,
    "batch_matmul": batch_matmul, "depthwise": depthwise, "depthwise_s2": lambda: depthwise(2),
    "dense_bf16": dense_bf16, "attention_bf16": attention_bf16,
    "depthwise_nchwc": depthwise_nchwc, "depthwise_nchwc_s2": lambda: depthwise_nchwc(2),
    "depthwise_nchwc16": lambda: depthwise_nchwc(block=16),
    # ResNeXt's grouped convs: fewer channels a group than the block (block-diagonal weights),
    # and a group of two blocks, strided.
    "group_conv_nchwc": group_conv_nchwc,
    "separable_resize": separable_resize,
    "group_conv_nchwc_wide_s2": lambda: group_conv_nchwc(per_group=16, stride=2),
    # MobileNet's 24 channels under a 16-lane plan take the largest divisor, 12: a block that
    # is not whole vectors (6 stands for it under AVX2's 8 lanes).
    "depthwise_nchwc12": lambda: depthwise_nchwc(block=12, channels=24),
    "depthwise_nchwc6": lambda: depthwise_nchwc(block=6, channels=24),
    "conv_nchwc_bf16": conv_nchwc_dot,
    "conv_nchwc_bf16_s2": lambda: conv_nchwc_dot(stride=2),
    "conv_padded_output_bf16": conv_padded_output_bf16,
    "conv_padded_output_u8": conv_padded_output_u8,
    "conv_nchwc_u8": lambda: conv_nchwc_dot("uint8"),
    "conv_nchwc_u8_residual": lambda: conv_nchwc_dot("uint8", stride=2, residual=True),
    "conv_nchwc_bf16_wide": lambda: conv_nchwc_dot(block=32),
    "conv_nchwc_u8_wide": lambda: conv_nchwc_dot("uint8", stride=2, residual=True, block=64),
    # AVX2's: NCHW8c, vpmaddubsw + vpmaddwd on 8 lanes.
    "conv_nchwc_u8_avx2": lambda: conv_nchwc_dot("uint8", lanes=8),
    "conv_nchwc_u8_avx2_residual": lambda: conv_nchwc_dot("uint8", stride=2, residual=True, lanes=8),
    "dense_u8s8": dense_u8s8,
    "conv_winograd": conv_winograd,
    "row_taps": row_taps,
    # A 7x7 map in tiles of 2 (the last row and column of tiles reach past it), no epilogue.
    "conv_winograd_m2_bare": lambda: conv_winograd(hw=7, m=2, epilogue=False),
    "conv_winograd_bf16": lambda: conv_winograd(dtype="bfloat16"),
    "conv_winograd_bf16_dot": lambda: conv_winograd(m=2, dtype="bfloat16", dot=True),
}

# Target configs by name; CUDA ones cross-build (no GPU is needed).
TARGETS: dict[str, dict] = {
    "llvm": {},  # filled from the host in _target()
    "cuda-sm90": {"kind": "cuda", "arch": "sm_90"},
    # An AVX-512 VNNI CPU, for checks of the dot-product templates that build nothing: they
    # must run on a host without those instructions too (an AVX2 Zen 3 runs CI some days).
    "llvm-vnni": {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2},
    # An AVX2 CPU (8-lane int8 dot products); its code runs on any AVX2 host, AVX-512 ones too.
    "llvm-avx2": {"kind": "llvm", "mcpu": "haswell", "num-cores": 2},
    # An AMX CPU, for the AMX templates' checks that build nothing.
    "llvm-amx": {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2},
}
# The (task, target) pairs the suite covers; CUDA keeps to the two heavy patterns.
TASK_TARGETS = [("matmul", "llvm"), ("conv", "llvm"), ("relu", "llvm"), ("conv_nchwc", "llvm"),
                ("dense", "llvm"), ("dense_packed", "llvm"), ("depthwise", "llvm"), ("depthwise_nchwc", "llvm"),
                ("dense_bf16", "llvm"),
                ("conv_nchwc_bf16", "llvm"), ("conv_nchwc_u8", "llvm"), ("dense_u8s8", "llvm"),
                ("conv_nchwc_u8_avx2", "llvm"),
                ("conv_winograd", "llvm"), ("softmax", "llvm"), ("layer_norm", "llvm"), ("row_taps", "llvm"),
                ("matmul", "cuda-sm90"), ("conv", "cuda-sm90")]  # fmt: skip


# Knob values the template tests start from (the rest take each knob's first choice).
NCHWC_DEFAULTS = {"tile_oh": 1, "tile_oc": 1, "tile_ic": 4, "order": 0, "unroll_kw": 1, "parallel_depth": 2,
                  "pad_inline": 0, "fuse_pixels": 1}
# The dot-product instructions' tests run where the CPU has them.
needs_bf16 = pytest.mark.skipif("avx512_bf16" not in host_cpu_info()["isa_flags"], reason="this CPU has no AVX512_BF16")
needs_vnni = pytest.mark.skipif("avx512_vnni" not in host_cpu_info()["isa_flags"], reason="this CPU has no AVX512_VNNI")
needs_avx2 = pytest.mark.skipif("avx2" not in host_cpu_info()["isa_flags"], reason="this CPU has no AVX2")
needs_amx_bf16 = pytest.mark.skipif(not {"amx_tile", "amx_bf16"} <= set(host_cpu_info()["isa_flags"]),
                                    reason="this CPU has no AMX-BF16")
needs_amx_int8 = pytest.mark.skipif(not {"amx_tile", "amx_int8"} <= set(host_cpu_info()["isa_flags"]),
                                    reason="this CPU has no AMX-INT8")
DOT_DEFAULTS = {"tile_oh": 1, "tile_oc": 1, "tile_ic": 1, "order": 0, "unroll_kw": 1, "parallel_depth": 2,
                "fuse_pixels": 1}
DENSE_DOT_DEFAULTS = {"tile_n": 16, "panel": 1, "unroll_k": 1, "order": 0, "parallel_depth": 1}
DENSE_DEFAULTS = {"unroll_k": 4, "order": 0, "parallel_depth": 1, "pack_b": 0}  # tile_n: its first, one vector


def named_point(sp: SearchSpace, defaults: dict, **values) -> Point:
    """A template point from knob values by name: ``values`` over ``defaults`` over each
    knob's first choice."""
    named = {**defaults, **values}
    return Point(0, tuple(named.get(k.name, k.choices[0]) for k in sp.knobs(0)))


@functools.cache
def target(name: str) -> tvm.target.Target:
    """A test target by name (``llvm`` is the host CPU)."""
    if name == "llvm":
        from tuner.device import parse_device

        return parse_device("cpu").target
    return tvm.target.Target(TARGETS[name])


@functools.cache
def task(name: str) -> tvm.IRModule:
    """A test task by name (built once per session)."""
    return TASKS[name]()


def _cases() -> list[tuple[str, str, str]]:
    out = []
    for kind in search_spaces.kinds():
        for task_name, target_name in TASK_TARGETS:
            if kind == "sketch":
                out.append((kind, task_name, target_name))
                continue
            template = search_spaces.get_template(kind)
            tgt = target(target_name)
            if template.knobs(task(task_name), tgt, search_spaces.limits_for(tgt)) is not None:
                out.append((kind, task_name, target_name))
    return out


CASES = _cases()
# TVM's sketch rules on the Winograd conv take tens of seconds a use on 2 cores.
HEAVY_CASES = {("sketch", "conv_winograd", "llvm")}


@functools.cache
def space(kind: str, task_name: str, target_name: str) -> SearchSpace:
    """The space of a case, built once per session (spaces cache applied points)."""
    return search_spaces.create(task(task_name), target(target_name), kind=kind)


@pytest.fixture(params=[pytest.param(c, marks=pytest.mark.slow) if c in HEAVY_CASES else c for c in CASES],
                ids=["-".join(c) for c in CASES])
def case(request) -> tuple[str, str, str]:
    """One (kind, task, target) case of the conformance suite."""
    return request.param


@pytest.fixture
def case_space(case) -> SearchSpace:
    """The space of the current case."""
    return space(*case)
