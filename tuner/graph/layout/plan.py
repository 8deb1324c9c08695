"""The layout vocabulary (NCHW, NHWC, blocked NCHW{b}c, Winograd tiles), the per-conv
:class:`LayoutPlan`, and what a graph's convs and dense layers admit.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.ir.expr import Constant

from search_spaces.constraints import is_x86

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
    from tuner.graph.winograd import TILES

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

    A blocked layout is a request: a conv whose channels the block does not divide takes
    :func:`channel_block` (ResNet's first conv reads 3 channels: ``NCHW3c`` in; 120 channels
    take ``NCHW8c`` under ``NCHW16c``), a
    depthwise conv takes the block with ``OIHW1i{b}o`` weights (:func:`depthwise_conv2d_nchwc`;
    NHWC leaves it NCHW), another grouped conv takes it where its groups and the block line up
    (:func:`grouped_fits`; :func:`group_conv2d_nchwc`) and stays NCHW elsewhere. A plan holds
    one block size: TVM 0.27's ``ConvertLayout`` cannot convert between two blocked layouts
    (``NCHW4c`` to ``NCHW8c`` fails with "Invalid layout axis"), while the same block always
    gives a consumer the block its producer wrote (same channel count, same channel block).
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


def conv_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """The ``relax.nn.conv2d`` calls of ``main`` in binding order: the plan's indices."""
    calls: list[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == _CONV2D:
            calls.append(expr)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return calls


def channel_block(channels: int, block: int) -> int:
    """The channel block a conv of ``channels`` takes under ``NCHW{block}c``: all of them where
    they fit in one block, the block where it divides them, else the largest power of two that
    divides them, up to the block.

    A block of any other size leaves a vector register partly used and its loads unaligned:
    on an Intel Xeon (AVX-512, 16 lanes), a depthwise 5x5 over 120 channels in ``NCHW15c``
    took 2.8x the faster peer's time (0.187 vs 0.067 ms) and 1x1 convs over 120 or 72 channels
    1.4-2.2x (benchmarks/results/op_profile_mnasnet1_0_rocketlake.json). Where padding to whole
    blocks costs little, the channels are padded instead (:mod:`tuner.graph.layout.channel_pad`)."""
    if channels <= block:
        return channels
    if channels % block == 0:
        return block
    return min(block, channels & -channels)


def conv_layouts(call: relax.Call, layout: str) -> list[str] | None:
    """``ConvertLayout``'s [data, kernel, output] layouts that put ``call`` in ``layout``, or
    None for a conv not imported as NCHW/OIHW (left to follow its input)."""
    attrs = call.attrs
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return None
    # Even an NCHW conv is stated: without a wish, ConvertLayout runs a conv in its input's
    # layout. Grouped convs stay NCHW under NHWC (TOPI's grouped NHWC conv is unchecked here)
    # and under a block they do not line up with (grouped_fits).
    grouped = int(attrs.groups) != 1
    block = block_of(layout)
    if layout == NCHW or (grouped and (block is None or not grouped_fits(call, block))):
        return [NCHW, "OIHW", NCHW]
    if layout == NHWC:
        return [NHWC, "OHWI", NHWC]
    assert block is not None, layout
    out_ch, in_ch = (int(d) for d in call.args[1].ty.shape.values[:2])
    if is_depthwise(call):
        # Each output channel reads its own input channel: one block for both, and the
        # weights' (C, 1, KH, KW) become (C/b, 1, KH, KW, 1, b).
        b = channel_block(out_ch, block)
        return [blocked(b), f"OIHW1i{b}o", blocked(b)]
    if grouped:
        # The weights' (C, C/g, KH, KW) in any blocked form: legalize re-packs the constant.
        b = channel_block(out_ch, block)
        return [blocked(b), f"OIHW{math.gcd(in_ch, b)}i{b}o", blocked(b)]
    ib, ob = channel_block(in_ch, block), channel_block(out_ch, block)
    return [blocked(ib), f"OIHW{ib}i{ob}o", blocked(ob)]


def out_dtype(call: relax.Call) -> str:
    """A conv's accumulation and output dtype: an unset ``out_dtype`` (None or "") means the
    data's dtype."""
    attrs = call.attrs
    return str(attrs.out_dtype) if attrs.out_dtype not in (None, "", "void") else str(call.args[0].ty.dtype)


def winograd_fits(call: relax.Call) -> bool:
    """True for a conv that Winograd F(m, 3) computes here: 3x3, stride 1, no dilation, one
    group, batch 1, float32 data and weights or bf16 ones summed in float32 (a bf16 model's,
    computed in float32 from the bf16 values, :mod:`tuner.graph.winograd`)."""
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


#: Most multiply-adds a blocked grouped conv may spend per useful one: with fewer channels a
#: group than the block, each block's reduction runs over the whole block
#: (:func:`group_conv2d_nchwc`), ``block / channels a group`` times the work.
MAX_GROUP_WASTE = 4


def grouped_fits(call: relax.Call, block: int) -> bool:
    """Whether a grouped conv runs in ``NCHW{b}c`` (``b`` its :func:`channel_block` under
    ``block``): a depthwise conv always (:func:`depthwise_conv2d_nchwc`); another one
    (ResNeXt's, RegNet's) where it keeps its channel count, its weight is a constant, ``b`` is
    at least 4 and its channels a group are a multiple of ``b`` or divide it at most
    :data:`MAX_GROUP_WASTE` times (:func:`group_conv2d_nchwc`). The layout chooser still weighs it against NCHW."""
    if is_depthwise(call):
        return True
    out_ch, per_group = (int(d) for d in call.args[1].ty.shape.values[:2])
    in_ch = int(call.args[0].ty.shape.values[1])
    b = channel_block(out_ch, block)
    if in_ch != out_ch or not isinstance(call.args[1], Constant) or b < 4:
        return False
    return per_group % b == 0 or (b % per_group == 0 and b // per_group <= MAX_GROUP_WASTE)


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
    from search_spaces.x86.intrin import dot_for, exact_for

    if weight is None or int(call.attrs.groups) != 1:
        return None
    shape = [int(d) for d in weight.ty.shape.values]
    if len(shape) != 6:
        return None
    dot = dot_for((str(call.args[0].ty.dtype), str(call.args[1].ty.dtype)), shape[-1])
    if dot is None or shape[-2] % dot.elements or not exact_for(dot, weight.value.numpy(), 4):
        return None
    return dot.elements


def wide_blocks(target: tvm.target.Target) -> dict[str, int]:
    """Input channel blocks, by data dtype, that fill an AMX tile row (32 bfloat16, 64 uint8)
    where ``target`` has the tile multiply: a conv whose data is padded by another function
    (:data:`PAD_APART`) reads it in that block (``x86-conv2d-amx``: each tile
    multiply then does 2x, 4x the work of one 16-channel block, for the same cycles)."""
    from search_spaces.x86.intrin_amx import AMX_DOTS, target_has_amx

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


#: The annotation of :func:`row_taps`'s block: ``[first, last, slots]``, output columns
#: ``[first, last)`` read no padding, ``slots`` slots a channel.
ROW_TAPS_ATTR = "nightshift.row_taps"


def dense_block(n: int, lanes: int) -> int | None:
    """Columns per block of a packed float32 dense weight with ``n`` columns: four vectors
    (a panel of the x86-dense template's best tiles), or None when they do not divide ``n``."""
    block = 4 * lanes
    return block if n % block == 0 else None


#: Extra columns a dense weight may take to reach whole blocks (:func:`padded_columns`).
DENSE_PAD_OVERHEAD = 1 / 32


def padded_columns(n: int, lanes: int) -> int | None:
    """The column count a float32 dense weight with ``n`` columns is padded to with zeros, so
    that it packs in whole :func:`dense_block` blocks, or None where it stays: already whole
    blocks, or more than :data:`DENSE_PAD_OVERHEAD` extra work. An image classifier's 1000
    classes are no whole number of 16-lane vectors, so no x86-dense point fits them and only
    the sketches could schedule the layer; padded to 1024 (2.4% more work) they pack. The
    bound is tight because the output is then copied without its padding, and a weight
    that is whole vectors already runs the template unpacked."""
    block = 4 * lanes
    if n % block == 0:
        return None
    padded = -(-n // block) * block
    return padded if padded - n <= DENSE_PAD_OVERHEAD * n else None


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
             ("conv2d_NCHWc_grouped", None),
             ("conv2d_nchw", NCHW), ("conv2d_nhwc", NHWC), ("group_conv2d_nchw", NCHW),
             ("group_conv2d_nhwc", NHWC))  # fmt: skip
    try:
        sch.get_sblock("conv2d_NCHWc_winograd")  # tuner.graph.winograd's conv: its tile is its inverse's
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

    NHWC is not a candidate by default: each candidate layout costs probe batches (its two
    heaviest convs, and each other conv its measured speed could win:
    :class:`tuner.search.scheduler.TaskScheduler`), and NHWC's spaces were not measured
    competitive here (pass it explicitly to :func:`tuner.graph.tasks.extract_layout_tasks` and
    :func:`choose_from_database` to weigh it).

    ``precision``: int8 keeps the blocked layout alone, its convs on the dot product. bf16
    weighs the blocked layout against Winograd F(2, 3) with its GEMMs on ``vdpbf16ps``
    (:func:`tuner.graph.winograd.transform_weight_dot`) where the CPU has no AMX (an AMX tile
    multiply does 4x ``vdpbf16ps``'s work a step, twenty-eighth session). On a Zen 4 its
    ResNet-50 job chose it for the 3x3 convs of the first three stages and ran 0.94-0.96x
    the time of a job without it (benchmarks/README.md, "bf16 Winograd F(2, 3) on the dot
    product"); on a Zen 5 for all 13, 0.939-0.945x in three runs ("The four
    reduced-precision rows on a Zen 5"). F(4, 3) is not weighed for bf16: rounded to bf16 it
    errs 7.6-8.9x the direct conv (:mod:`tuner.graph.winograd`). Where bf16 is computed on fp32
    FMAs (:func:`tuner.precision.bf16_arithmetic`: Intel cores without AMX) its convs are
    fp32 convs, and fp32's layouts are weighed.

    A bf16 model's 3x3 convs can also run by Winograd in float32 (``--layout NCHWc:w4``,
    :mod:`tuner.graph.winograd`), but weighing it by default did not pay: on a Zen 4 (2026-11-26,
    ``benchmarks/results/db_ab_resnet50_bf16_winograd_vs_direct_zen4.json``) a 2,048-trial
    ResNet-50 job with the Winograd candidates ran 24.8 ms against 24.1 for one without, in
    the same rounds; its float32 transformed weights are 8x the bf16 direct conv's bytes,
    and in the model its Winograd convs ran 1.21-1.33x their tuned time
    (``op_profile_resnet50_bf16_2048_winograd_zen4.json``), the direct ones 1.01-1.24x. Its
    builds also took the job from 574 s to 1,326 s.
    """
    preferred = LayoutPlan.for_target(target).default
    from tuner.precision import Precision, bf16_arithmetic

    precision = Precision.parse(precision)
    if preferred == NCHW or precision.blocked_only:
        return (preferred,)
    if precision is Precision.BF16 and bf16_arithmetic(target) == "bf16":
        from search_spaces.x86.features import CpuFeatures
        from tuner.graph.winograd import DOT_TILE

        features = CpuFeatures.of(target)
        if features.bf16_dot and not features.amx_bf16:
            return (preferred, winograd(preferred, DOT_TILE))
        return (preferred,)
    return (preferred, winograd(preferred, 4), winograd(preferred, 2), NCHW)


def useful_layouts(mod: tvm.IRModule, layouts: Sequence[str]) -> tuple[str, ...]:
    """``layouts`` without the Winograd ones when no conv of ``mod`` fits Winograd (BERT,
    MobileNet): their plans would repeat the blocked layout's, task for task."""
    if any(winograd_fits(call) for call in conv_calls(mod)):
        return tuple(layouts)
    return tuple(x for x in layouts if winograd_tile(x) is None)
