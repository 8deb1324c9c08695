"""Data layout of each conv as a decision: the plan, the graph rewrite, and the chooser.

Task extraction (:func:`tuner.tasks.extract_tasks`) and compilation
(:func:`tuner.compile.compile_model`) both run :func:`prepare` with the same
:class:`LayoutPlan`, so the tuned tasks are exactly the functions the compiler looks up; a
conv's layout is part of its PrimFunc, hence of its workload key.

Layouts: ``NCHW`` (as imported), ``NHWC`` (weights ``OHWI``) and blocked ``NCHW{b}c``
(weights ``OIHW{i}i{o}o``, TOPI's ``conv2d_NCHWc``): channels split into chunks of ``b``
lanes so the innermost loop of the conv fills a vector register. Relax's ``ConvertLayout``
rewrites the graph and inserts ``layout_transform`` where a consumer keeps another layout;
the weights' transforms are constants and fold away at compile time.

A blocked layout may carry a Winograd tile, ``NCHW16c:w4``: each 3x3 stride-1 float32 conv
planned so runs by Winograd F(4, 3) (:mod:`tuner.winograd`, weights transformed at compile
time) in that layout; a conv it does not fit runs as in ``NCHW16c``.

Dense layers have one layout on CPUs: a float32 matmul by a constant weight reads it packed
(:func:`pack_dense_weight`), done while legalizing (:func:`prepare`), whatever the plan.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.ir.expr import Constant
from tvm.relax import pipeline as relax_pipeline

from search_spaces.constraints import is_x86
from tuner.fold import fold_constants
from tuner.pad_fusion import emit_padded, emit_subsampled, var_reads

logger = logging.getLogger(__name__)

NCHW = "NCHW"
NHWC = "NHWC"
_BLOCKED = re.compile(r"NCHW(\d+)c")
_WINOGRAD = re.compile(r"(NCHW\d+c):w(\d+)")
_CONV2D = "relax.nn.conv2d"
_MATMUL = "relax.matmul"
_GELU = "relax.nn.gelu"
_ERF = "relax.erf"
_SOFTMAX = "relax.nn.softmax"
_LAYOUT_TRANSFORM = "relax.layout_transform"


def blocked(block: int) -> str:
    """The blocked layout name with ``block`` channels per chunk (``NCHW16c``)."""
    return f"NCHW{block}c"


def block_of(layout: str) -> int | None:
    """The channel block of ``NCHW{b}c`` (or ``NCHW{b}c:w{m}``); None for an unblocked layout."""
    m = _BLOCKED.fullmatch(data_layout(layout))
    return int(m.group(1)) if m else None


def winograd(layout: str, tile: int = 4) -> str:
    """The blocked ``layout`` whose 3x3 stride-1 convs run by Winograd F(``tile``, 3)."""
    return f"{data_layout(layout)}:w{tile}"


def winograd_tile(layout: str) -> int | None:
    """The Winograd output tile of ``NCHW{b}c:w{m}``; None for a layout without one."""
    m = _WINOGRAD.fullmatch(layout)
    return int(m.group(2)) if m else None


def data_layout(layout: str) -> str:
    """The layout the tensors are in: ``NCHW16c`` for ``NCHW16c:w4`` (the algorithm aside)."""
    m = _WINOGRAD.fullmatch(layout)
    return m.group(1) if m else layout


def check_layout(layout: str) -> str:
    """``layout`` if it is one a plan can hold, else ValueError naming the choices."""
    from tuner.winograd import TILES

    tile = winograd_tile(layout)
    if tile is not None and tile not in TILES:
        raise ValueError(f"Winograd tile {tile} in {layout!r} is not one of {TILES}")
    if layout in (NCHW, NHWC) or (block_of(layout) or 0) > 0:
        return layout
    raise ValueError(f"unknown conv layout {layout!r}: use NCHW, NHWC, NCHW<block>c (e.g. NCHW16c) "
                     "or NCHW<block>c:w4 (its 3x3 convs by Winograd)")


def vector_lanes(target: tvm.target.Target) -> int:
    """fp32 lanes of the target's vector registers (16 with AVX-512, 8 with AVX2)."""
    from search_spaces.constraints import limits_for

    return limits_for(target).vector_bits // 32


@dataclass(frozen=True)
class LayoutPlan:
    """The data layout of every 2-D conv of a model.

    Attributes:
        default: layout of every conv not in ``layouts``.
        layouts: per-conv layouts, indexed by the conv's position in the model's ``main``
            (binding order, counting every ``relax.nn.conv2d``); shorter than the number of
            convs means the rest take ``default``.

    A blocked layout is a request: a conv whose channels the block does not divide takes the
    largest divisor below it (ResNet's first conv reads 3 channels: ``NCHW3c`` in), a
    depthwise conv takes the block with ``OIHW1i{b}o`` weights (:func:`depthwise_conv2d_nchwc`;
    NHWC leaves it NCHW), and other grouped convs (TOPI's ``conv2d_NCHWc`` has no groups)
    stay NCHW. A plan holds one block size: TVM 0.27's ``ConvertLayout`` cannot convert
    between two blocked layouts (``NCHW4c`` to ``NCHW8c`` fails with "Invalid layout axis"),
    while the same block always gives a consumer the block its producer wrote (same channel
    count, same divisor).
    """

    default: str = NCHW
    layouts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for layout in (self.default, *self.layouts):
            check_layout(layout)
        blocks = {block_of(x) for x in (self.default, *self.layouts)} - {None}
        if len(blocks) > 1:
            raise ValueError(f"a layout plan holds one block size, got {sorted(blocks)}")

    def layout_of(self, index: int) -> str:
        """The layout planned for conv number ``index``."""
        return self.layouts[index] if index < len(self.layouts) else self.default

    @property
    def is_identity(self) -> bool:
        """True when every conv stays NCHW (the graph is left as imported)."""
        return self.default == NCHW and all(x == NCHW for x in self.layouts)

    def __str__(self) -> str:
        if not self.layouts:
            return self.default
        return f"{self.default} with " + ",".join(self.layouts)

    @classmethod
    def for_target(cls, target: tvm.target.Target) -> LayoutPlan:
        """The default plan: blocked by the vector width on x86 CPUs with AVX2 or AVX-512,
        NCHW elsewhere (CUDA, other CPUs)."""
        if str(target.kind.name) != "llvm" or not is_x86(target):
            return cls(NCHW)
        lanes = vector_lanes(target)
        return cls(blocked(lanes)) if lanes >= 8 else cls(NCHW)

    @classmethod
    def parse(cls, text: str, target: tvm.target.Target) -> LayoutPlan:
        """``auto`` (:meth:`for_target`), ``NCHW``, ``NHWC``, ``NCHWc`` (the target's vector
        width), ``NCHWc:w4`` (the same, 3x3 stride-1 convs by Winograd) or ``NCHW<b>c[:w<m>]``,
        applied to every conv."""
        if text == "auto":
            return cls.for_target(target)
        if text == "NCHWc":
            return cls(blocked(vector_lanes(target)))
        if text.startswith("NCHWc:"):
            return cls(check_layout(blocked(vector_lanes(target)) + text[len("NCHWc"):]))
        return cls(check_layout(text))


# ----------------------------------------------------------------------------- the rewrite


def conv_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """The ``relax.nn.conv2d`` calls of ``main`` in binding order: the plan's indices."""
    calls: list[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == _CONV2D:
            calls.append(expr)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return calls


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def conv_layouts(call: relax.Call, layout: str) -> list[str] | None:
    """``ConvertLayout``'s [data, kernel, output] layouts that put ``call`` in ``layout``, or
    None for a conv not imported as NCHW/OIHW (left to follow its input)."""
    attrs = call.attrs
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return None
    # Even an NCHW conv is stated: without a wish, ConvertLayout runs a conv in its input's
    # layout. Grouped convs other than depthwise stay NCHW: conv2d_NCHWc has no groups, and
    # TOPI's grouped NHWC conv is unchecked here; a depthwise conv takes NCHW as its NHWC.
    depthwise = is_depthwise(call)
    if layout == NCHW or (int(attrs.groups) != 1 and not depthwise) or (depthwise and layout == NHWC):
        return [NCHW, "OIHW", NCHW]
    if layout == NHWC:
        return [NHWC, "OHWI", NHWC]
    block = block_of(layout)
    assert block is not None, layout
    out_ch, in_ch = (int(d) for d in call.args[1].ty.shape.values[:2])
    if depthwise:
        # Each output channel reads its own input channel: one block for both, and the
        # weights' (C, 1, KH, KW) become (C/b, 1, KH, KW, 1, b).
        b = _largest_divisor(out_ch, block)
        return [blocked(b), f"OIHW1i{b}o", blocked(b)]
    ib, ob = _largest_divisor(in_ch, block), _largest_divisor(out_ch, block)
    return [blocked(ib), f"OIHW{ib}i{ob}o", blocked(ob)]


def out_dtype(call: relax.Call) -> str:
    """A conv's accumulation and output dtype: an unset ``out_dtype`` (None or "") means the
    data's dtype."""
    attrs = call.attrs
    return str(attrs.out_dtype) if attrs.out_dtype not in (None, "", "void") else str(call.args[0].ty.dtype)


def winograd_fits(call: relax.Call) -> bool:
    """True for a conv that Winograd F(m, 3) computes here: 3x3, stride 1, no dilation, one
    group, batch 1, float32 data and weights or bf16 ones summed in float32 (a bf16 model's,
    computed in float32 from the bf16 values, :mod:`tuner.winograd`)."""
    attrs = call.attrs
    kernel = [int(d) for d in call.args[1].ty.shape.values]
    dtypes = {str(call.args[0].ty.dtype), str(call.args[1].ty.dtype)}
    return (len(kernel) == 4 and kernel[2:] == [3, 3] and int(attrs.groups) == 1
            and all(int(s) == 1 for s in attrs.strides) and all(int(d) == 1 for d in attrs.dilation)
            and (dtypes == {"float32"} or dtypes == {"bfloat16"}) and out_dtype(call) == "float32"
            and int(call.args[0].ty.shape.values[0]) == 1)  # fmt: skip


def is_depthwise(call: relax.Call) -> bool:
    """True for a conv with one input and one output channel per group (MobileNet's)."""
    groups = int(call.attrs.groups)
    out_ch, in_per_group = (int(d) for d in call.args[1].ty.shape.values[:2])
    return groups > 1 and in_per_group == 1 and out_ch == groups


def _pad_nchwc(data: te.Tensor, window: Sequence[int], strides: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int], name: str) -> tuple[te.Tensor, int, int]:
    """``NCHW{b}c`` data padded by ``padding`` (top, left, bottom, right) in a block ``name``
    (as is when there is none), and the output height and width of a conv over it."""
    _, _, h, w, _ = (int(d) for d in data.shape)
    top, left, bottom, right = padding
    if any(padding):
        data = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name=name)
    oh = (h + top + bottom - (window[0] - 1) * dilation[0] - 1) // strides[0] + 1
    ow = (w + left + right - (window[1] - 1) * dilation[1] - 1) // strides[1] + 1
    return data, oh, ow


def depthwise_conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides: Sequence[int], padding: Sequence[int],
                           dilation: Sequence[int], out_dtype: str) -> te.Tensor:
    """A depthwise conv in ``NCHW{b}c`` with ``OIHW1i{b}o`` weights (channel multiplier 1).

    TOPI 0.27 declares ``depthwise_conv2d_NCHWc`` but registers no compute for it (its x86
    implementation went with ``topi.x86``). ``padding`` is (top, left, bottom, right).
    """
    n, chunks, _, _, block = (int(d) for d in data.shape)
    kh, kw = (int(d) for d in kernel.shape[2:4])
    (sh, sw), (dh, dw) = strides, dilation
    data, oh, ow = _pad_nchwc(data, (kh, kw), strides, padding, dilation, "PaddedInput")
    rh = te.reduce_axis((0, kh), name="kh")
    rw = te.reduce_axis((0, kw), name="kw")
    return te.compute(
        (n, chunks, oh, ow, block),
        lambda b, c, i, j, k: te.sum(
            data[b, c, i * sh + rh * dh, j * sw + rw * dw, k].astype(out_dtype)
            * kernel[c, 0, rh, rw, 0, k].astype(out_dtype), axis=[rh, rw]),
        name="depthwise_conv2d_NCHWc",
    )


def _constant(bb: relax.BlockBuilder, expr: relax.Expr) -> Constant | None:
    if isinstance(expr, relax.Var):
        expr = bb.lookup_binding(expr)
    return expr if isinstance(expr, Constant) else None


def dot_elements(call: relax.Call, weight: Constant | None) -> int | None:
    """Reduction elements per lane when a blocked conv can feed a dot-product instruction:
    its (data, weight) dtypes and output channel block are one of ``intrin_x86.DOTS``
    (vdpbf16ps adds bfloat16 pairs, vpdpbusd uint8 x int8 quadruples on AVX-512's 16 lanes,
    vpmaddubsw + vpmaddwd on AVX2's 8), its ``weight`` is a constant (it is re-packed now)
    whose sums the instruction computes exactly (``intrin_x86.exact_for``) and its blocks fit
    the instruction; else None."""
    from search_spaces.templates.intrin_x86 import dot_for, exact_for

    if weight is None or int(call.attrs.groups) != 1:
        return None
    shape = [int(d) for d in weight.ty.shape.values]
    if len(shape) != 6:
        return None
    dot = dot_for((str(call.args[0].ty.dtype), str(call.args[1].ty.dtype)), shape[-1])
    if dot is None or shape[-2] % dot.elements or not exact_for(dot, weight.value.numpy(), 4):
        return None
    return dot.elements


def widen_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """``OIHW{i}i{o}o`` weights as ``OIHW{block}i{o}o``: ``block / i`` neighbouring input
    chunks side by side, as :func:`tuner.pad_fusion.pad_interior` lays out the data."""
    oc, ic, kh, kw, ib, ob = weight.shape
    k = block // ib
    grouped = weight.reshape(oc, ic // k, k, kh, kw, ib, ob).transpose(0, 1, 3, 4, 2, 5, 6)
    return np.ascontiguousarray(grouped.reshape(oc, ic // k, kh, kw, block, ob))


def wide_blocks(target: tvm.target.Target) -> dict[str, int]:
    """Input channel blocks, by data dtype, that fill an AMX tile row (32 bfloat16, 64 uint8)
    where ``target`` has the tile multiply: a conv whose data is padded by another function
    (:data:`PAD_APART`) reads it in that block (``x86-conv2d-amx``: each tile
    multiply then does 2x, 4x the work of one 16-channel block, for the same cycles)."""
    from search_spaces.templates.intrin_amx import AMX_DOTS, target_has_amx

    return {inst.dtypes[0]: inst.step for inst in AMX_DOTS.values() if target_has_amx(target, inst)}


def _widens(weight_shape: Sequence[int], block: int | None) -> bool:
    """Whether a conv's input chunks (``OIHW{i}i{o}o`` weights) group into ``block``: a wide
    block holds whole neighbouring chunks (:func:`widen_weight`)."""
    chunks, ib = int(weight_shape[1]), int(weight_shape[4])
    return block is not None and block > ib and block % ib == 0 and chunks % (block // ib) == 0


def row_taps_fit(weight_shape: Sequence[int], block: int | None) -> bool:
    """Whether a conv of one input chunk of few channels (an image's: fewer than 16) fits a
    kernel row's taps x channels into ``block`` (ResNet's 7x7 stem over 4 channels: 8 taps
    a channel, 7 used), so that :func:`row_taps` can run it. A conv of 16 channels or more
    reads a block of whole pixels, its padded input written by its producer."""
    if block is None or len(weight_shape) != 6:
        return False
    _, chunks, _, kw, ib, _ = (int(d) for d in weight_shape)
    return chunks == 1 and ib < 16 and kw > 1 and kw <= block // ib


def row_taps(data: te.Tensor, padding: Sequence[int], kw: int, stride_w: int, block: int) -> te.Tensor:
    """``NCHW{b}c`` data of one chunk as the rows a conv reads along a kernel row: element
    (ih, ow, c t' + t) is the zero-padded input at row ih, column ``ow * stride_w + t``,
    channel c, with ``t' = block // b`` slots a channel (the ``kw`` taps, then zeros), so that
    each channel's taps are neighbouring columns of the image. A conv over it with the
    kernel's rows alone (kh x 1, stride 1 along the row, :func:`row_tap_weight`) is the conv
    over ``data``, each reduction step a whole ``block`` of the taps.

    The block is annotated with :data:`ROW_TAPS_ATTR`: the output columns whose every slot
    lies inside the image, which ``x86-row-taps`` vectorizes (there the bounds check is
    provably true and the slots past the taps are a select, not a branch)."""
    n, _, h, w, b = (int(d) for d in data.shape)
    top, left, bottom, right = padding
    ow = (w + left + right - kw) // stride_w + 1
    slots = block // b
    # Column ow reads image columns ow * stride_w - left + [0, slots).
    first = min(-(-left // stride_w), ow)
    last = max(first, min(ow, (w + left - slots) // stride_w + 1))
    zero = tvm.tirx.const(0, data.dtype)

    def value(i0, i1, i2, i3, i4):
        c, tap = i4 // slots, i4 % slots
        col = i3 * stride_w + tap - left
        inside = tvm.tirx.all(c < b, i2 >= top, i2 < h + top, col >= 0, col < w)
        # Every slot's column is bounds-checked, so the slots past the taps may load.
        return tvm.tirx.if_then_else(inside, tvm.tirx.Select(tap < kw, data[i0, i1, i2 - top, col, c], zero), zero)

    return te.compute((n, 1, h + top + bottom, ow, block), value, name="row_taps",
                      attrs={ROW_TAPS_ATTR: [first, last, slots]})


#: The annotation of :func:`row_taps`'s block: ``[first, last, slots]``, output columns
#: ``[first, last)`` read no padding, ``slots`` slots a channel.
ROW_TAPS_ATTR = "nightshift.row_taps"


def row_tap_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """``OIHW{b}i{o}o`` weights of one input chunk for a conv over :func:`row_taps`:
    ``OIH1{block}i{o}o``, each channel's kernel row taps in its ``block // b`` slots."""
    oc, _, kh, kw, ib, ob = weight.shape
    slots = block // ib
    out = np.zeros((oc, 1, kh, 1, block, ob), weight.dtype)
    for c in range(ib):
        out[:, 0, :, 0, c * slots:c * slots + kw] = weight[:, 0, :, :, c]
    return out


def pack_dot_weight(weight: np.ndarray, n: int) -> np.ndarray:
    """``OIHW{i}i{o}o`` weights as ``OIHW{i/n}i{o}o{n}i``: the ``n`` input channels one lane
    of the instruction reduces are adjacent, the ``o`` lanes of one register contiguous."""
    oc, ic, kh, kw, ib, ob = weight.shape
    return np.ascontiguousarray(weight.reshape(oc, ic, kh, kw, ib // n, n, ob).transpose(0, 1, 2, 3, 4, 6, 5))


def conv2d_nchwc_dot(data: te.Tensor, kernel: te.Tensor, strides: Sequence[int], padding: Sequence[int],
                     dilation: Sequence[int], out_dtype: str) -> te.Tensor:
    """A conv in ``NCHW{b}c`` with packed ``OIHW{i/n}i{o}o{n}i`` weights (:func:`pack_dot_weight`),
    summed in ``out_dtype``: TOPI's ``conv2d_NCHWc_int8`` compute (block ``conv2d_NCHWc_dot``)
    without the ``schedule_rule`` annotation for which MetaSchedule has no CPU rule and warns
    on every sketch. ``padding`` is (top, left, bottom, right)."""
    oc_chunks, ic_chunks, kh, kw, groups, oc_block, n = (int(d) for d in kernel.shape)
    (sh, sw), (dh, dw) = strides, dilation
    data, oh, ow = _pad_nchwc(data, (kh, kw), strides, padding, dilation, "data_pad")
    rh, rw = te.reduce_axis((0, kh), name="kh"), te.reduce_axis((0, kw), name="kw")
    rc = te.reduce_axis((0, ic_chunks), name="ic_chunk")
    rg, rn = te.reduce_axis((0, groups), name="ic_group"), te.reduce_axis((0, n), name="ic_lane")
    return te.compute(
        (int(data.shape[0]), oc_chunks, oh, ow, oc_block),
        lambda b, c, i, j, k: te.sum(
            data[b, rc, i * sh + rh * dh, j * sw + rw * dw, rg * n + rn].astype(out_dtype)
            * kernel[c, rc, rh, rw, rg, k, rn].astype(out_dtype), axis=[rh, rw, rc, rg, rn]),
        name="conv2d_NCHWc_dot",
    )


def _legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call,
                     winograd_calls: Sequence[tuple[relax.Call, int]] = (),
                     pad_apart: Sequence[str] = ("bfloat16",),
                     wide: Mapping[str, int] | None = None,
                     sole_reader: Collection[relax.Var] = ()) -> relax.Expr:  # fmt: skip
    """TOPI's ``conv2d_NCHWc`` for a blocked conv (the generic legalization leaves it as is),
    :func:`tuner.winograd.conv2d_nchwc_winograd` with transformed weights for one of
    ``winograd_calls`` (with its tile), :func:`conv2d_nchwc_dot` with packed weights for one
    that fits a dot-product instruction (bf16, uint8 x int8; :func:`dot_elements`), its data
    padded outside its function where the data's dtype is in ``pad_apart``
    (:data:`PAD_APART`) and then in the block ``wide`` gives for its dtype where the
    input channels fill it (:func:`wide_blocks`; a stride-1 1x1 conv too where its data is
    in ``sole_reader``, variables the conv alone reads), :func:`depthwise_conv2d_nchwc` for a
    blocked depthwise one; TVM's own legalization otherwise."""
    attrs = call.attrs
    if block_of(str(attrs.data_layout)) is None:
        return relax.transform.legalize_ops.nn._nn_conv2d(bb, call)
    out = out_dtype(call)
    tile = next((m for c, m in winograd_calls if c.same_as(call)), None)
    weight = _constant(bb, call.args[1])
    if tile is not None and weight is not None:
        from tuner.winograd import DOT_TILE, conv2d_nchwc_winograd, transform_weight, transform_weight_dot

        w = weight.value.numpy().astype(np.float32)
        if tile == DOT_TILE and str(weight.ty.dtype) == "bfloat16":
            # A bf16 model's F(2, 3): GEMMs on vdpbf16ps, weights transformed and rounded to bf16.
            packed = relax.const(transform_weight_dot(w, tile), "bfloat16")
        else:
            # float32: a bf16 model's F(4, 3) weights are transformed from their bf16 values
            # and not rounded again (tuner.winograd).
            packed = relax.const(transform_weight(w, tile), "float32")
        return bb.call_te(conv2d_nchwc_winograd, call.args[0], packed, [int(p) for p in attrs.padding], tile,
                          out, primfunc_name_hint="conv2d_NCHWc_winograd")  # fmt: skip
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
        from search_spaces.templates.intrin_x86 import BF16_DOT

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
            # which tuner.pad_fusion moves into the data's producer (PAD_APART says why), in
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


def dense_block(n: int, lanes: int) -> int | None:
    """Columns per block of a packed float32 dense weight with ``n`` columns: four vectors
    (a panel of the x86-dense template's best tiles), or None when they do not divide ``n``."""
    block = 4 * lanes
    return block if n % block == 0 else None


def pack_dense_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """A ``[K, N]`` weight as ``[N / block, K, block]``: each block of columns one
    contiguous panel, which a register tile streams through with unit stride."""
    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k, n // block, block).transpose(1, 0, 2))


def matmul_packed(a: te.Tensor, w: te.Tensor) -> te.Tensor:
    """``a[..., K] @ W`` for a weight packed by :func:`pack_dense_weight` (block ``matmul``,
    as Relax's own legalization names it, so the tasks keep their names)."""
    _, k_extent, block = (int(d) for d in w.shape)
    k = te.reduce_axis((0, k_extent), name="k")

    def body(*idx):
        j = idx[-1]
        return te.sum(a[(*idx[:-1], k)] * w[j // block, k, j % block], axis=k)

    return te.compute((*a.shape[:-1], int(w.shape[0]) * block), body, name="matmul")


def _legalize_matmul(lanes: int) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    """A float32 matmul by a constant ``[K, N]`` weight (every dense layer) reads the weight
    packed (:func:`pack_dense_weight`, converted once, now); other matmuls legalize as TVM
    does. Row-major, a tile's K steps are a row of the weight apart (12 KiB in BERT's FFN);
    packed, they are adjacent. On BERT-base's dense shapes the best of 16 x86-dense points
    took 1-7% less time packed than row-major (copying panels at run time or not), and the
    same tile 16-39% less than copying its panels at run time (benchmarks/dense_packing.py)."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        weight = _constant(bb, call.args[1])
        shape = _static_shape(call.args[0])
        out_dtype = str(call.attrs.out_dtype) if call.attrs.out_dtype not in (None, "", "void") else "float32"
        block = None
        if (weight is not None and len(weight.ty.shape.values) == 2 and shape is not None and len(shape) >= 2
                and str(weight.ty.dtype) == str(call.args[0].ty.dtype) == out_dtype == "float32"):  # fmt: skip
            block = dense_block(int(weight.ty.shape.values[1]), lanes)
        if weight is None or block is None:
            return relax.transform.legalize_ops.linear_algebra._matmul(bb, call)
        packed = relax.const(pack_dense_weight(weight.value.numpy(), block), "float32")
        return bb.call_te(matmul_packed, call.args[0], packed, primfunc_name_hint="matmul")

    return legalize


def _static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return tuple(int(d) for d in values)


def simplify_sums(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``sum(stack([a, b, ...]), axis=stacked)`` as ``a + b + ...`` and drop
    ``broadcast_to`` onto a tensor's own shape.

    ONNX's importer writes every ``Sum`` node (ResNet's residual adds) that way; the 5-D
    stacked tensor has no layout ``ConvertLayout`` can carry a blocked layout through (it
    fails with "Invalid SLayout"), and an add fuses into the conv before it.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def same_shape_broadcast(expr: relax.Expr, matches: dict) -> relax.Expr:
        src = expr.args[0]
        return src if _static_shape(src) is not None and _static_shape(src) == _static_shape(expr) else expr

    stack = is_op("relax.stack")(wildcard())
    summed = is_op("relax.sum")(stack)

    def sum_of_stack(expr: relax.Expr, matches: dict) -> relax.Expr:
        stacked = matches[stack]
        parts = stacked.args[0]
        axis = int(stacked.attrs.axis)
        if not isinstance(parts, relax.Tuple) or expr.attrs.keepdims or [int(a) for a in expr.attrs.axis] != [axis]:
            return expr
        out = parts.fields[0]
        for part in parts.fields[1:]:
            out = relax.op.add(out, part)
        return out

    funcs = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            func = rewrite_call(is_op("relax.broadcast_to")(wildcard(), wildcard()), same_shape_broadcast, func)
            func = rewrite_call(summed, sum_of_stack, func)
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


def clip_as_min_max(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``clip(x, lo, hi)`` (ReLU6) as ``minimum(maximum(x, lo), hi)``.

    Relax registers no layout inference for ``clip``, so ``ConvertLayout`` brings its input
    back to NCHW and its output forward again: in MobileNet-V2 that put two transforms
    around every ReLU6 (a third of the model's time) and kept ReLU6 out of the convs'
    epilogues. Elementwise ``maximum``/``minimum`` follow any layout, and their scalar
    constants legalize to immediates.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def as_min_max(expr: relax.Call, matches: dict) -> relax.Expr:
        x, lo, hi = expr.args
        dtype = str(x.ty.dtype)
        # The bounds are immediates (a PrimValue around one in older Relax).
        imm = (tvm.tirx.IntImm, tvm.tirx.FloatImm)
        bounds = [b if isinstance(b, imm) else getattr(b, "value", None) for b in (lo, hi)]
        if any(not isinstance(v, imm) for v in bounds) or not dtype.startswith("float"):
            return expr
        low, high = (relax.const(float(v.value), dtype) for v in bounds)
        return relax.op.minimum(relax.op.maximum(x, low), high)

    funcs = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            func = rewrite_call(is_op("relax.clip")(wildcard(), wildcard(), wildcard()), as_min_max, func)
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


#: The data dtypes whose dot-product convs read their input padded by another function.
#: bfloat16: TVM computes on bfloat16 buffers that a function allocates in float32
#: (``BF16ComputeLegalize``), so a padded copy made inside the conv's function could not
#: feed ``vdpbf16ps``. uint8 too: a uint8 conv (zero point 0, so the border is 0) would
#: otherwise pad in a pass of its own inside its function, which reads the producer's output
#: back and writes it again; apart, :func:`tuner.pad_fusion.fold_pad_into_producer` has the
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


def sole_readers(func: relax.Function) -> frozenset[relax.Var]:
    """The variables bound in ``func`` that one expression alone reads: a conv's data among
    them is nothing else's, so its producer may write it in the conv's own layout
    (parameters are left out: no function of the graph produces them)."""
    reads = var_reads(func)
    return frozenset(b.var for block in func.body.blocks for b in block.bindings if reads.get(b.var) == 1)


def prepare(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan) -> tvm.IRModule:
    """Put every conv of a bound module (weights as constants) in its planned layout.

    Converts the graph (``layout_transform`` where consumers keep another layout), legalizes
    blocked convs to ``topi.nn.conv2d_NCHWc`` and everything else as TVM does (but GELU,
    softmax and dense layers with packed weights on CPUs, see :func:`_legalize_gelu` and
    :func:`_legalize_matmul`), and folds the weights' transforms into constants. On
    a non-CPU target an identity plan returns ``mod`` unchanged.
    """
    cpu = str(target.kind.name) == "llvm"
    if plan.is_identity and not cpu:
        return mod
    wanted: dict[relax.Call, list[str]] = {}
    tiles: dict[int, int] = {}
    for index, call in enumerate(conv_calls(mod)):
        layouts = conv_layouts(call, plan.layout_of(index))
        if layouts is not None:
            wanted[call] = layouts
            tile = winograd_tile(plan.layout_of(index))
            if tile is not None and block_of(layouts[0]) is not None and winograd_fits(call):
                tiles[index] = tile
    converted = sum(layouts[0] != NCHW for layouts in wanted.values())
    if not converted and not cpu:
        return mod
    if converted:
        mod = clip_as_min_max(simplify_sums(mod))

    # ConvertLayout asks for the layouts of the original call (before it rewrites its args).
    def layout_cb(call: relax.Call) -> dict[str, list[str]]:
        layouts = wanted.get(call)
        return {_CONV2D: layouts} if layouts is not None else {}

    try:
        dispatch = list(relax_pipeline.library_dispatch_passes(target))
    except (ValueError, AttributeError):
        dispatch = []
    convert = tvm.transform.Sequential([
        relax.transform.ConvertLayout({}, layout_cb),
        relax.transform.CanonicalizeBindings(),
    ])  # fmt: skip
    with target, tvm.transform.PassContext(opt_level=3):
        # The weights' layout transforms are folded in numpy before legalizing (tuner.fold);
        # FoldConstant would build each of them with LLVM.
        folded = fold_constants(convert(mod) if converted else mod)
    # ConvertLayout and the folding keep the convs in binding order: the plan's indices.
    winograd_calls = [(call, tiles[i]) for i, call in enumerate(conv_calls(folded)) if i in tiles]
    custom = {_CONV2D: functools.partial(_legalize_conv2d, winograd_calls=winograd_calls, pad_apart=PAD_APART,
                                         wide=wide_blocks(target), sole_reader=sole_readers(folded["main"])),
              _LAYOUT_TRANSFORM: _legalize_layout_transform}  # fmt: skip
    if cpu:
        custom[_GELU] = _legalize_gelu
        custom[_ERF] = _legalize_erf
        custom[_SOFTMAX] = _legalize_softmax
        custom[_MATMUL] = _legalize_matmul(vector_lanes(target))
    legalize = tvm.transform.Sequential([
        *dispatch,
        relax.transform.LegalizeOps(customize_legalize_map=custom),
        relax.transform.FoldConstant(),
    ])  # fmt: skip
    with target, tvm.transform.PassContext(opt_level=3):
        out = legalize(folded)
    logger.info("layout plan %s: %d of %d convs converted, %d by Winograd", plan, converted, len(wanted),
                len(winograd_calls))  # fmt: skip
    return out


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


def fast_softmax_last_axis(x: te.Tensor) -> te.Tensor:
    """TOPI's ``fast_softmax`` over the last axis (the same blocks and names), but normalized by
    the reciprocal of each row's sum, ``T_softmax_rcp``, instead of a division per element. On
    an AMX Xeon BERT-base's softmax was its costliest function outside the matmuls, and the
    best ``x86-softmax`` point at its shape took 0.90x the time this way
    (benchmarks/bert_epilogues.py). Within 1e-5 of the exact softmax, as TOPI's
    (tests/tuner/test_layout.py)."""
    *rows, length = x.shape
    k = te.reduce_axis((0, length), name="k")
    maxelem = te.compute(rows, lambda *i: te.max(x(*i, k), axis=k), name="T_softmax_maxelem")
    delta = te.compute(x.shape, lambda *i: x(*i) - maxelem(*i[:-1]), name="T_softmax_delta")
    exp = topi.fast_exp(delta)
    k = te.reduce_axis((0, length), name="k")
    expsum = te.compute(rows, lambda *i: te.sum(exp(*i, k), axis=k), name="T_softmax_expsum")
    rcp = te.compute(rows, lambda *i: tvm.tirx.const(1.0, "float32") / expsum(*i), name="T_softmax_rcp")
    return te.compute(x.shape, lambda *i: exp(*i) * rcp(*i[:-1]), name="T_softmax_norm",
                      attrs={"axis": len(x.shape) - 1})


# ----------------------------------------------------------------------------- the chooser


def transform_seconds(num_elements: int, *, bytes_per_element: int = 4, bandwidth: float = 10e9) -> float:
    """Estimated time of one ``layout_transform`` of a tensor: read it once and write it once
    at ``bandwidth`` bytes/s (a strided copy; 10 GB/s is a conservative single-core rate)."""
    return 2.0 * num_elements * bytes_per_element / bandwidth


@dataclass(frozen=True)
class LayoutChoice:
    """The chooser's answer: the plan and its estimated total seconds."""

    plan: LayoutPlan
    seconds: float


def choose_layouts(
    conv_seconds: Sequence[Mapping[str, float]],
    transform_cost: Callable[[int, str, str], float],
    *,
    input_layout: str = NCHW,
    output_layout: str = NCHW,
) -> LayoutChoice:
    """Each conv's layout by dynamic programming (Viterbi) over the chain of convs.

    Args:
        conv_seconds: for each conv in graph order, the best measured seconds of its task in
            each layout it was tuned in (a layout missing from a conv's map is not a choice
            for it; at least one per conv).
        transform_cost: ``transform_cost(i, a, b)``: seconds to bring conv ``i``'s input from
            layout ``a`` (what conv ``i - 1`` wrote, or ``input_layout`` for ``i = 0``) to ``b``;
            called only where ``a`` and ``b`` lay the data out differently.
            ``i = len(conv_seconds)`` is the model's output.
        input_layout: layout of the model's input.
        output_layout: layout the last conv's output must reach (NCHW: what the frontend's
            classifier head reads).

    Returns:
        The plan minimizing the sum of conv seconds and transform seconds, and that sum.

    What this approximates (as AutoTVM's graph tuner did for chains): the network is taken as
    the chain of its convs in graph order. Elementwise ops, pooling and residual adds run in
    whatever layout their producer wrote and are costed as free; a residual branch's own
    transform (an add whose two inputs arrive in different layouts) is not counted. For
    ResNet-like graphs, where consecutive convs share channel counts, this captures the
    transforms that matter.
    """
    if not conv_seconds:
        return LayoutChoice(LayoutPlan(NCHW), 0.0)
    # best[layout] = (cost so far, plan so far) after the current conv, ending in ``layout``.
    best: dict[str, tuple[float, tuple[str, ...]]] = {input_layout: (0.0, ())}
    for i, options in enumerate(conv_seconds):
        if not options:
            raise ValueError(f"conv {i} has no measured layout")
        step: dict[str, tuple[float, tuple[str, ...]]] = {}
        for layout, secs in options.items():
            step[layout] = min(
                ((cost + secs + (transform_cost(i, prev, layout) if _moves(prev, layout) else 0.0), (*path, layout))
                 for prev, (cost, path) in best.items()),
                key=lambda c: c[0],
            )  # fmt: skip
        best = step
    end = len(conv_seconds)
    total, path = min(
        ((cost + (transform_cost(end, last, output_layout) if _moves(last, output_layout) else 0.0), path)
         for last, (cost, path) in best.items()),
        key=lambda c: c[0],
    )  # fmt: skip
    return LayoutChoice(LayoutPlan(path[-1], path), total)


def _moves(src: str, dst: str) -> bool:
    """Whether going from a conv in ``src`` to one in ``dst`` transforms the tensor between
    them (not from ``NCHW16c`` to ``NCHW16c:w4``: the same data, another algorithm)."""
    return data_layout(src) != data_layout(dst)


def activation_elements(mod: tvm.IRModule) -> list[int]:
    """For each conv of ``mod`` in plan order, the number of elements of its input: what a
    layout transform in front of it moves (for :func:`transform_seconds`)."""
    return [math.prod(int(d) for d in call.args[0].ty.shape.values) for call in conv_calls(mod)]


def task_layout(mod: tvm.IRModule) -> str:
    """The conv layout of a task's PrimFunc (``NCHW16c``, ``NHWC``, ``NCHW``), read from its
    conv block; empty when it has none."""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    # conv2d_NCHWc_dot: a bf16 or int8 conv on a dot-product instruction (conv2d_nchwc_dot).
    names = (("conv2d_NCHWc", None), ("conv2d_NCHWc_dot", None), ("depthwise_conv2d_NCHWc", None),
             ("conv2d_nchw", NCHW), ("conv2d_nhwc", NHWC), ("group_conv2d_nchw", NCHW),
             ("group_conv2d_nhwc", NHWC))  # fmt: skip
    try:
        sch.get_sblock("conv2d_NCHWc_winograd")  # tuner.winograd's conv: its tile is its inverse's
        inverse = sch.get(sch.get_sblock("inverse"))  # (oc_chunk, tile, m, m, oc_block)
        return winograd(blocked(int(inverse.iter_vars[4].dom.extent)), int(inverse.iter_vars[2].dom.extent))
    except (RuntimeError, ValueError):  # no such block
        pass
    for name, layout in names:
        try:
            block = sch.get(sch.get_sblock(name))
        except (RuntimeError, ValueError):  # no such block
            continue
        # A blocked conv is named by its output block: what its consumer reads.
        return layout or blocked(int(block.iter_vars[4].dom.extent))  # n, oc_chunk, oh, ow, oc_block
    return ""


def io_bytes(mod: tvm.IRModule) -> int:
    """Bytes of every tensor argument of a task's ``main``: what a memory-bound operator (a
    layout transform) reads and writes once."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    total = 0
    for arg in ArgInfo.from_prim_func(mod["main"]):
        shape, dtype = getattr(arg, "shape", None), getattr(arg, "dtype", None)
        if shape is not None and dtype is not None:
            total += math.prod(int(d) for d in shape) * tvm.DataType(str(dtype)).bits // 8
    return total


def auto_layouts(target: tvm.target.Target, precision: str = "fp32") -> tuple[str, ...]:
    """The layouts ``--layout auto`` tunes every conv in and chooses between, preferred first:
    the target's blocked layout (:meth:`LayoutPlan.for_target`), the same with its 3x3
    stride-1 convs by Winograd F(4, 3) and F(2, 3) (``NCHW16c:w4``, ``NCHW16c:w2``; a conv
    they do not fit gives the blocked layout's task, so only those convs add tasks) and
    NCHW; NCHW alone where no blocked layout applies (CUDA, CPUs without AVX2). F(4, 3) does
    4x fewer multiply-adds than a direct conv but reads 4x the weights, F(2, 3) 2.25x fewer
    and 1.8x: which wins depends on how the weights compare with the work (a 7x7 map's
    many channels against a 56x56 map's few), so both are measured.

    NHWC is not a candidate by default: each candidate layout costs every conv a probe batch,
    and NHWC's spaces were not measured competitive here (pass it explicitly to
    :func:`tuner.tasks.extract_layout_tasks` and :func:`choose_from_database` to weigh it).

    ``precision``: int8 keeps the blocked layout alone, its convs on the dot product. bf16
    weighs the blocked layout against Winograd F(2, 3) with its GEMMs on ``vdpbf16ps``
    (:func:`tuner.winograd.transform_weight_dot`) where the CPU has no AMX (an AMX tile
    multiply does 4x ``vdpbf16ps``'s work a step, twenty-eighth session). On a Zen 4 its
    ResNet-50 job chose it for the 3x3 convs of the first three stages and ran 0.94-0.96x
    the time of a job without it (benchmarks/README.md, "bf16 Winograd F(2, 3) on the dot
    product"); on a Zen 5 for all 13, 0.939-0.945x in three runs ("The four
    reduced-precision rows on a Zen 5"). F(4, 3) is not weighed for bf16: rounded to bf16 it
    errs 7.6-8.9x the direct conv (:mod:`tuner.winograd`). Where bf16 is computed on fp32
    FMAs (:func:`tuner.precision.bf16_arithmetic`: Intel cores without AMX) its convs are
    fp32 convs, and fp32's layouts are weighed.

    A bf16 model's 3x3 convs can also run by Winograd in float32 (``--layout NCHWc:w4``,
    :mod:`tuner.winograd`), but weighing it by default did not pay: on a Zen 4 (2026-11-26,
    ``benchmarks/results/db_ab_resnet50_bf16_winograd_vs_direct_zen4.json``) a 2,048-trial
    ResNet-50 job with the Winograd candidates ran 24.8 ms against 24.1 for one without, in
    the same rounds; its float32 transformed weights are 8x the bf16 direct conv's bytes,
    and in the model its Winograd convs ran 1.21-1.33x their tuned time
    (``op_profile_resnet50_bf16_2048_winograd_zen4.json``), the direct ones 1.01-1.24x. Its
    builds also took the job from 574 s to 1,326 s.
    """
    preferred = LayoutPlan.for_target(target).default
    if preferred == NCHW or precision == "int8":
        return (preferred,)
    from tuner.precision import bf16_arithmetic

    if precision == "bf16" and bf16_arithmetic(target) == "bf16":
        from search_spaces.templates.intrin_amx import AMX_BF16, target_has_amx
        from search_spaces.templates.intrin_x86 import target_has_bf16_dot
        from tuner.winograd import DOT_TILE

        if target_has_bf16_dot(target) and not target_has_amx(target, AMX_BF16):
            return (preferred, winograd(preferred, DOT_TILE))
        return (preferred,)
    return (preferred, winograd(preferred, 4), winograd(preferred, 2), NCHW)


def useful_layouts(mod: tvm.IRModule, layouts: Sequence[str]) -> tuple[str, ...]:
    """``layouts`` without the Winograd ones when no conv of ``mod`` fits Winograd (BERT,
    MobileNet): their plans would repeat the blocked layout's, task for task."""
    if any(winograd_fits(call) for call in conv_calls(mod)):
        return tuple(layouts)
    return tuple(x for x in layouts if winograd_tile(x) is None)


@dataclass(frozen=True)
class PlanWorkloads:
    """The fused tasks a plan gives a model: ``tasks`` maps workload keys to (name, weight,
    task module); ``conv_keys`` is each conv's task key in plan order."""

    plan: LayoutPlan
    tasks: dict[str, tuple[str, int, tvm.IRModule]]
    conv_keys: list[str]


def plan_workloads(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan, *,
                   precision: str = "fp32") -> PlanWorkloads:  # fmt: skip
    """The tasks of a bound module (already in ``precision``) under ``plan``, with the keys
    :func:`tuner.tasks.extract_tasks` gives them (without MetaSchedule's extraction)."""
    from tuner.tasks import fuse, fused_conv_keys, workload_key  # tuner.tasks imports this module

    fused = fuse(prepare(mod, target, plan), target)
    tasks: dict[str, tuple[str, int, tvm.IRModule]] = {}

    def visit(expr: relax.Expr) -> None:
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir"):
            return
        gv = expr.args[0]
        func = fused[gv]
        if func.attrs and func.attrs.get("tirx.is_scheduled", False):
            return
        task = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        key = workload_key(task, precision)
        name, weight, _ = tasks.get(key, (gv.name_hint, 0, task))
        tasks[key] = (name, weight + 1, task)

    relax.analysis.post_order_visit(fused["main"].body, visit)
    keys = fused_conv_keys(fused, precision)
    if len(keys) != len(conv_calls(mod)):
        raise ValueError(f"found {len(keys)} conv tasks for {len(conv_calls(mod))} convs")
    return PlanWorkloads(plan, tasks, keys)


def conv_task_keys(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan) -> list[str]:
    """For each conv of a bound module, in plan order, the workload key of the fused task
    that computes it under ``plan`` (the key :func:`tuner.tasks.extract_tasks` gives it)."""
    return plan_workloads(mod, target, plan).conv_keys


def measured_bandwidth(plans: Sequence[PlanWorkloads], best_seconds: Callable[[str], float | None]) -> float | None:
    """Bytes/s of the model's measured ``layout_transform`` tasks (the median over them), or
    None when no plan has one measured: what a transform the plans do not contain costs."""
    rates = []
    seen: set[str] = set()
    for pw in plans:
        for key, (name, _weight, task) in pw.tasks.items():
            if key in seen or "layout_transform" not in name:
                continue
            seen.add(key)
            sec = best_seconds(key)
            moved = io_bytes(task)
            if sec and moved:
                rates.append(moved / sec)
    return sorted(rates)[len(rates) // 2] if rates else None


def plan_seconds(pw: PlanWorkloads, best_seconds: Callable[[str], float | None], bandwidth: float,
                 blind: Collection[str] = ()) -> float:  # fmt: skip
    """A plan's estimated model latency: every task's weight x best measured seconds; a task
    without a record costs its bytes at ``bandwidth`` (the transforms and elementwise ops a
    mixed plan adds), except a conv, which makes the plan unmeasured (inf), unless it is in
    ``blind`` (convs measured in no candidate layout: they cost nothing in every plan)."""
    convs = set(pw.conv_keys) - set(blind)
    total = 0.0
    for key, (_name, weight, task) in pw.tasks.items():
        sec = best_seconds(key)
        if sec is None:
            if key in convs:
                return math.inf
            if key in blind:
                continue
            sec = io_bytes(task) / bandwidth
        total += weight * sec
    return total


@dataclass(frozen=True)
class ConvDecision:
    """One conv's layout in the chosen plan and the best measured seconds of its task in each
    candidate layout (a layout without a record is absent)."""

    index: int
    layout: str
    seconds: dict[str, float]
    #: ``3x3 64->64 56x56``: kernel, channels and input size.
    shape: str = ""


@dataclass(frozen=True)
class PlanChoice:
    """What :func:`choose_from_database` chose, and why.

    Attributes:
        plan: the chosen plan.
        seconds: its estimated model latency (:func:`plan_seconds`).
        candidates: every plan weighed (each uniform layout, the chain optimum) by its
            description, with its estimated latency (inf: a conv of it was never measured).
        convs: each conv's decision with its measured seconds per layout.
        bandwidth: bytes/s charged for a transform; ``bandwidth_measured`` says whether it
            came from the model's measured transform tasks or :data:`DEFAULT_BANDWIDTH`.
    """

    plan: LayoutPlan
    seconds: float
    candidates: dict[str, float]
    convs: list[ConvDecision]
    bandwidth: float
    bandwidth_measured: bool

    @property
    def measured(self) -> bool:
        """Whether the choice rests on measurements (else it is the target's default plan)."""
        return math.isfinite(self.seconds)

    def describe(self) -> str:
        """One line: the chosen plan against the other candidates."""
        counts: dict[str, int] = {}
        for c in self.convs:
            counts[c.layout] = counts.get(c.layout, 0) + 1
        mix = ", ".join(f"{n} {layout}" for layout, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        others = "; ".join(f"{name} {sec * 1e3:.2f} ms" if math.isfinite(sec) else f"{name} unmeasured"
                           for name, sec in self.candidates.items())  # fmt: skip
        if not self.measured:
            return f"convs: {mix} (no measured plan; the target's default); weighed: {others}"
        return f"convs: {mix}, estimated {self.seconds * 1e3:.2f} ms; weighed: {others}"

    def to_json(self) -> dict:
        """The choice as plain JSON types (inf as None)."""

        def ms(sec: float) -> float | None:
            return sec * 1e3 if math.isfinite(sec) else None

        return {
            "plan": str(self.plan), "layouts": [c.layout for c in self.convs], "estimated_ms": ms(self.seconds),
            "candidates_ms": {name: ms(sec) for name, sec in self.candidates.items()},
            "bandwidth_gbps": self.bandwidth / 1e9, "bandwidth_measured": self.bandwidth_measured,
            "convs": [{"index": c.index, "shape": c.shape, "layout": c.layout,
                       "best_ms": {k: v * 1e3 for k, v in c.seconds.items()}} for c in self.convs],
        }  # fmt: skip


# Bytes/s charged for a layout transform when the model has none measured: a strided copy on
# one core (conservative).
DEFAULT_BANDWIDTH = 10e9


def choose_from_database(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    best_seconds: Callable[[str], float | None],
    layouts: Sequence[str],
    *,
    precision: str = "fp32",
    bandwidth: float | None = None,
) -> PlanChoice:
    """The per-conv plan that the measurements favour, among uniform candidate ``layouts``.

    Args:
        mod: the bound module (:meth:`tuner.frontends.ModelSpec.bound`), in ``precision``.
        target: the target the tasks were extracted for.
        best_seconds: a workload key's best measured seconds on the device, or None when it
            has no record (e.g. ``lambda k: (r := db.best(k, dev_id)) and r[0].mean_sec``).
        layouts: the layouts the model's convs were tuned in (``NCHW8c``, ``NCHW``, ...),
            preferred first (it breaks ties).
        precision: the precision of the workload keys.
        bandwidth: bytes/s of a layout transform; default: measured from the model's
            ``layout_transform`` tasks in the database, else :data:`DEFAULT_BANDWIDTH`.

    Two steps. The chain optimum (:func:`choose_layouts`) over the convs' measured bests,
    each switch of layout costing a transform of the conv's input at ``bandwidth``. Then
    every candidate (that plan and each uniform plan) is costed in full from the tasks it
    really gives the model (:func:`plan_seconds`): every transform, residual ones included,
    and every operator in the layout it ends up in. The cheapest wins, so the choice is never
    estimated slower than the best single layout. A conv measured in no layout costs nothing
    in each, so only the transforms decide it; a plan that puts a conv in a layout it was not
    measured in is unmeasured (inf). When no plan is measured, the target's default plan.
    """
    LayoutPlan(NCHW, tuple(layouts))  # rejects unknown layouts and mixed blocks up front
    layouts = useful_layouts(mod, layouts)
    uniform = [plan_workloads(mod, target, LayoutPlan(layout), precision=precision) for layout in layouts]
    measured = measured_bandwidth(uniform, best_seconds)
    bw = bandwidth or measured or DEFAULT_BANDWIDTH
    calls = conv_calls(mod)
    conv_seconds: list[dict[str, float]] = []
    for i in range(len(calls)):
        found = {pw.plan.default: best_seconds(pw.conv_keys[i]) for pw in uniform}
        conv_seconds.append({k: float(v) for k, v in found.items() if v is not None})
    elements = [*activation_elements(mod), math.prod(int(d) for d in calls[-1].ty.shape.values)] if calls else []
    itemsize = tvm.DataType(str(calls[0].args[0].ty.dtype)).bits // 8 if calls else 4

    def cost(i: int, _src: str, _dst: str) -> float:
        return transform_seconds(elements[i], bytes_per_element=itemsize, bandwidth=bw)

    chain = choose_layouts([c or dict.fromkeys(layouts, 0.0) for c in conv_seconds], cost)
    blind = {pw.conv_keys[i] for i, c in enumerate(conv_seconds) if not c for pw in uniform}
    candidates = {pw.plan.default: (pw, plan_seconds(pw, best_seconds, bw, blind)) for pw in uniform}
    chain_plan = chain.plan
    if len(set(chain_plan.layouts)) == 1:
        chain_plan = LayoutPlan(chain_plan.layouts[0])
    if str(chain_plan) not in candidates:
        pw = plan_workloads(mod, target, chain_plan, precision=precision)
        candidates["per-conv chain"] = (pw, plan_seconds(pw, best_seconds, bw, blind))
    if not any(conv_seconds):
        # No conv measured in any layout: transforms alone would rank the plans, on nothing
        # the database knows. Every plan is unmeasured, and the target's default is taken.
        candidates = {name: (pw, math.inf) for name, (pw, _sec) in candidates.items()}
    # min keeps the first of equals: the preferred layout.
    best_pw, best_sec = min(candidates.values(), key=lambda c: c[1])
    if not math.isfinite(best_sec):
        best_pw = candidates.get(LayoutPlan.for_target(target).default, (uniform[0], math.inf))[0]
    plan = best_pw.plan
    convs = [ConvDecision(i, plan.layout_of(i), conv_seconds[i], _conv_shape(call)) for i, call in enumerate(calls)]
    choice = PlanChoice(plan, best_sec, {name: sec for name, (_pw, sec) in candidates.items()}, convs, bw,
                        bandwidth is None and measured is not None)  # fmt: skip
    logger.info("layout choice: %s", choice.describe())
    return choice


def _conv_shape(call: relax.Call) -> str:
    out_ch, in_ch, kh, kw = (int(d) for d in call.args[1].ty.shape.values[:4])
    h, w = (int(d) for d in call.args[0].ty.shape.values[2:4])
    groups = int(call.attrs.groups)
    grouped = f" /{groups}" if groups != 1 else ""
    return f"{kh}x{kw} {in_ch * groups}->{out_ch}{grouped} {h}x{w}"


_SUMMARY_LAYOUT = re.compile(r" layout=(\S+)$")


def stored_layouts(db, keys: Collection[str] | None = None) -> dict[str, str]:
    """The conv layout of each stored workload (of ``keys``, default all) that has a conv:
    the layout every record of that workload belongs to.

    Read from the workload's summary (``... layout=NCHW8c``, written since the layout became
    a tuning decision); a workload stored before that is read from its serialized PrimFunc.
    SQL reaches the same facts: ``SELECT key FROM workloads WHERE summary LIKE '% layout=NCHW'``.
    """
    import json

    from sqlalchemy import select
    from tvm.s_tir.meta_schedule.database import Workload

    from tuner.db.schema import WorkloadRow

    stmt = select(WorkloadRow.key, WorkloadRow.summary, WorkloadRow.workload_json)
    if keys is not None:
        stmt = stmt.where(WorkloadRow.key.in_(list(keys)))
    with db.session(write=False) as s:
        rows = list(s.execute(stmt))
    found: dict[str, str] = {}
    for key, summary, workload_json in rows:
        if summary and (m := _SUMMARY_LAYOUT.search(summary)):
            found[key] = m.group(1)
            continue
        try:
            layout = task_layout(Workload.from_json(json.loads(workload_json)).mod)
        except Exception as err:  # a workload of another TVM version may not load: no layout known
            logger.debug("workload %s: %s", key, err)
            continue
        if layout:
            found[key] = layout
    return found
