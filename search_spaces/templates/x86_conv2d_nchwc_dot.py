"""``x86-conv2d-nchwc-dot``: blocked conv2d on an x86 dot-product instruction (+ epilogue).

The register tile of ``x86-conv2d-nchwc`` with its FMA replaced by an instruction that
multiplies ``n`` adjacent input channels into each of 16 output lanes and adds them:
``vdpbf16ps`` for bfloat16 (``n = 2``, float32 sums) and ``vpdpbusd`` for uint8 x int8
(``n = 4``, int32 sums); on AVX2, 8 output lanes of uint8 x int8 by ``vpmaddubsw`` and
``vpmaddwd`` (exact for the weights ``tuner.graph.layout.plan.dot_elements`` lets through). For each
step of the reduction, the ``n`` input channels of one pixel are one 32-bit lane,
broadcast, and each of the tile's ``tile_oc`` weight registers holds 16 (8) output
channels x ``n`` input channels (one 512-bit, 256-bit load).

The pixels of the tile are a ``tile_oh x reg_n`` rectangle or, with ``fuse_pixels``,
``reg_n`` pixels of the fused (oh, ow) axis with a shorter last tile peeled, as in
``x86-conv2d-nchwc`` (whose docstring says why): AVX-512's 24 accumulators fit 12 pixels x 2
channel blocks or 6 x 4, which no rectangle of ResNet-50's 7- and 14-wide maps is. TVM's
``tensorize`` compares the block's predicate too, so where the last tile is partial its
bounds check goes onto an outer block and the instruction inside. On a Zen 4, ResNet-50 bf16
after 2048 trials ran in 0.93x the time of the same job's rectangles alone (benchmarks/README.md,
"Pixel and row tiles on the dot-product instructions").

The threads share the work by output channel tiles (``split`` 0: each computes its channels
over every pixel) or by pixel tiles (``split`` 1: each computes its rows over every channel).
By channels each thread reads all of the input, half of which the producer's other thread has
just written into its own core's cache; by pixels consecutive convs find their rows where
they left them. Timed alone, as a job times a candidate, the input is in both cores' caches
and the split by pixels mostly loses (it reads every weight once per pixel tile); in the
model it gains that back. On an AVX2 Zen 3, ResNet-50 int8 with 12 large-activation convs
forced to split by pixels ran 0.95x and 1.01x the time in two runs, and a job's records split
by pixels 0.94x the same job's model without them (benchmarks/README.md, "AVX2 Zen 3: the
host's slow phases hit TVM's large-activation convs; convs split by pixels").

The task is what :func:`tuner.graph.layout.rewrites.prepare` makes of such a conv (``dot_elements``):
``tuner.graph.layout.ops.conv2d_nchwc_dot`` (TOPI's ``conv2d_NCHWc_int8`` compute), block
``conv2d_NCHWc_dot`` with spatial iters (n, oc_chunk, oh, ow, oc_block) and reduce iters
(kh, kw, ic_chunk, ic_group, ic_lane), weights packed ``OIHW{i/n}i16o{n}i`` (``8o`` on AVX2) at compile
time; an optional ``data_pad`` block before it (uint8 on AMX targets; always its own pass:
a padded load cannot feed the instruction); elementwise epilogue blocks after it (bias,
residual, relu, requantize). The last of them may be ``padded_output``, the copy into the
interior of the next conv's padded input (``tuner.graph.pad_fusion``): the tile is stored at its
offset there, and the border is zeroed by a function of its own.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.lowering import HINT
from search_spaces.templates.blocks import (
    accumulate_locally,
    elementwise_prologue,
    elementwise_tail,
    iter_kinds,
    root_blocks,
)
from search_spaces.templates.registry import Template, register_template
from search_spaces.templates.x86_conv2d_nchwc import (
    _MAX_UNROLLED_FMAS,
    _MIN_ACC_REGISTERS,
    _ORDERS,
    _PAD,
    _acc_budget,
    _has_pad,
    _pixel_violation,
    pixel_tiles,
)
from search_spaces.x86.intrin import AVX2_DOT, DotInstruction, dot_for, register_intrinsics, target_has

logger = logging.getLogger(__name__)

NAME = "x86-conv2d-nchwc-dot"
_CONV_PREFIX = "conv2d_NCHWc_dot"
# The block that copies a dot conv's input into the interior of its padded shape
# (tuner.graph.pad_fusion): it can end the producing conv's epilogue, elementwise over its output.
PADDED_OUTPUT = "padded_output"


def _conv_block(sch: Schedule) -> Any | None:
    found = [b for b in root_blocks(sch) if sch.get(b).name_hint.startswith(_CONV_PREFIX)]
    if len(found) != 1:
        return None
    return found[0] if iter_kinds(sch, found[0]) == "SSSSSRRRRR" else None


def _tail(sch: Schedule, conv: Any) -> list[str] | None:
    """The epilogue blocks after the conv, or None when a block does not fit the tile: an
    epilogue not elementwise over the conv's output, or a block before the conv that is
    not the padding and reduces (elementwise ones are inlined, :func:`elementwise_prologue`)."""
    if elementwise_prologue(sch, conv, keep=(_PAD,)) is None:
        return None
    return elementwise_tail(sch, conv, 5)


def _dot(sch: Schedule, conv: Any) -> DotInstruction | None:
    """The instruction for the conv's (data, weight) dtypes, output channel block and lane
    group, or None."""
    reads = sch.get(conv).reads
    if len(reads) != 2:
        return None
    oc_block = int(sch.get(sch.get_loops(conv)[4]).extent)
    dot = dot_for((str(reads[0].source.dtype), str(reads[1].source.dtype)), oc_block)
    if dot is None or int(sch.get(sch.get_loops(conv)[-1]).extent) != dot.elements:
        return None
    return dot


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    sch = Schedule(mod)
    conv = _conv_block(sch)
    if conv is None or _tail(sch, conv) is None:
        return None
    dot = _dot(sch, conv)
    if dot is None or not target_has(target, dot.feature):
        return None
    if dot.dtypes[0] == "bfloat16" and _has_pad(sch):
        # TVM computes a bfloat16 buffer that a function allocates in float32, which
        # vdpbf16ps cannot read: tuner.graph.layout pads bfloat16 data in a function of its own.
        return None
    _, oc_chunks, oh, ow, _, _, kw, _, groups, _ = (int(sch.get(loop).extent) for loop in sch.get_loops(conv))
    max_pixels = min(dot_budget(limits), oh * ow)
    return (
        # Output pixels of the register tile: reg_n along the row (dividing it), tile_oh
        # rows; or, with fuse_pixels, reg_n along the fused (oh, ow) axis.
        Knob("reg_n", "choice", tuple(range(1, max_pixels + 1))),
        Knob("tile_oh", "choice", tuple(d for d in divisors(oh) if d <= 4)),
        Knob("tile_oc", "choice", tuple(d for d in divisors(oc_chunks) if d <= 4)),
        # Instruction steps of one channel block unrolled per step of the reduction.
        Knob("tile_ic", "choice", divisors(groups)),
        Knob("order", "choice", _ORDERS),
        Knob("unroll_kw", "choice", (1, kw) if kw > 1 else (1,)),
        Knob("parallel_depth", "choice", (2, 3, 4)),
        # 1: the pixel tile runs along the fused (oh, ow) axis (see the module's docstring).
        Knob("fuse_pixels", "choice", (0, 1)),
        # How the threads share the work: 0 by output channel tiles, 1 by pixel tiles (the
        # module's docstring says why).
        Knob("split", "choice", (0, 1)),
        # Fixed by the task; knobs so the constraint can read them.
        Knob("out_h", "choice", (oh,)),
        Knob("out_w", "choice", (ow,)),
    )


def dot_budget(limits: Limits) -> int:
    """Accumulator registers of a register tile on a dot-product instruction: the FMA
    templates' budget, less the scratch registers the instruction needs. With 16 vector
    registers the instruction is AVX2's (the others are AVX-512's), whose int16 products
    take one: 13."""
    scratch = AVX2_DOT.scratch if limits.vector_registers < 32 else 0
    return min(_acc_budget(limits), limits.vector_registers - 2 - scratch)


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    regs = values["reg_n"] * values["tile_oh"] * values["tile_oc"]
    budget = dot_budget(limits)
    if regs > budget:
        return f"register tile needs {regs} vector registers, more than {budget}"
    if regs < _MIN_ACC_REGISTERS:
        return f"register tile of {regs} vector registers, fewer than {_MIN_ACC_REGISTERS}"
    pixels_wrong = _pixel_violation(values)
    if pixels_wrong:
        return pixels_wrong
    if values["split"] and values["fuse_pixels"] and values["out_h"] * values["out_w"] % values["reg_n"]:
        # The peeled last tile needs the pixel-tile loop of its own, not fused into the parallel one.
        return "a split by pixels with a partial last pixel tile"
    body = regs * values["tile_ic"] * values["unroll_kw"]
    if body > _MAX_UNROLLED_FMAS:
        return f"unrolled reduction body of ~{body} dot products, more than {_MAX_UNROLLED_FMAS}"
    return None


# Register tiles every job measures first, as (pixels, channel blocks) along the fused pixel
# axis: the two that most conv tasks' bests took in two ResNet-50 bf16 jobs on a Zen 4
# (2026-11-27: 4 x 4 in 14 of 58 tasks, 7 x 2 in 13, either pixel tiling) and oneDNN's
# AVX-512 tiles of 24 accumulators, 6 x 4 and 12 x 2 (x86_dense_dot's starts).
_START_TILES = ((4, 4), (7, 2), (6, 4), (12, 2))
# AVX2's budget of 13 takes none of those. Its starts are the tiles most of ResNet-50's int8
# conv tasks' bests took in an AVX2 job (Zen 3, 2026-11-29: 4 x 2 in 11 of 33 tasks, 2 x 4 in
# 8, 8 x 1 in 4, 6 x 2 in 2); likely because an accumulator there waits only on a vpaddd (not
# measured). A job starting from them ran the model in the same time as one without
# (benchmarks/README.md, "AVX2 Zen 3: requantize epilogues vectorized by TVM").
_AVX2_START_TILES = ((4, 2), (2, 4), (8, 1), (6, 2))


def _starts(choices: dict[str, tuple], limits: Limits) -> list[dict[str, Any]]:
    """The start points: each tile along the fused pixel axis, a whole channel chunk of
    instruction steps unrolled, the (batch, channel chunk) loops parallel (which any pixel
    count takes), AVX2's own where the target has its 16 vector registers. Tiles the task's
    channels or pixels do not take are dropped by the space."""
    tiles = _AVX2_START_TILES if limits.vector_registers < 32 else _START_TILES
    return [{"reg_n": pixels, "tile_oh": 1, "tile_oc": blocks, "tile_ic": max(choices["tile_ic"]), "order": 0,
             "unroll_kw": 1, "parallel_depth": 2, "fuse_pixels": 1}
            for pixels, blocks in tiles]  # fmt: skip


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    register_intrinsics()
    conv = _conv_block(sch)
    dot = None if conv is None else _dot(sch, conv)
    if conv is None or dot is None:
        raise ValueError("no conv2d_NCHWc_dot block with bfloat16 or uint8 x int8 operands")
    conv_name = sch.get(conv).name_hint
    conv, store = accumulate_conv(sch, conv)
    tiles = pixel_tiles(sch, conv, store, values)
    outer_loops, tile_loops, oc_t, oc_block, peel = tiles.outer, tiles.tile, tiles.oc_t, tiles.oc_block, tiles.peel
    if values["split"]:
        n, oc_o, *pixels = outer_loops
        outer_loops = [n, *pixels, oc_o]  # the parallel loops are the batch's and the pixel tiles'
    kh, kw, ic_chunk, ic_group, ic_lane = tiles.reduce
    ig_o, ig_i = sch.split(ic_group, [None, values["tile_ic"]])
    order = values["order"]
    if order == 0:
        reduction = [ic_chunk, ig_o, kh, kw, ig_i]
    elif order == 1:
        reduction = [ic_chunk, ig_o, kh, ig_i, kw]
    else:
        reduction = [kh, kw, ic_chunk, ig_o, ig_i]
    sch.reorder(*outer_loops, *reduction, *tile_loops, oc_t, oc_block, ic_lane)
    sch.reverse_compute_at(store, outer_loops[-1])
    sch.parallel(sch.fuse(*outer_loops[:values["parallel_depth"]]))
    if peel is not None:
        sch.annotate(peel, HINT, 1)  # the shorter last tile is peeled (search_spaces.lowering)
    init = sch.decompose_reduction(conv, reduction[0])
    if peel is None:
        sch.tensorize(oc_block, dot.intrin)
    else:
        # Tensorize matches the block's predicate too, and the partial tile's bounds check
        # is one: blockize moves it to an outer block, the instruction goes inside.
        sch.blockize(oc_block)
        sch.tensorize(sch.get_loops(conv)[-2], dot.intrin)
    sch.unroll(ig_i)
    if values["unroll_kw"] > 1:
        sch.unroll(kw)
    for loop in tile_loops:
        sch.unroll(loop)
    sch.unroll(oc_t)
    tile = sch.get_loops(store)[1 + len(outer_loops) - values["parallel_depth"]:]
    sch.vectorize(tile[-1])
    for loop in tile[:-1]:
        sch.unroll(loop)
    sch.vectorize(sch.get_loops(init)[-1])
    schedule_pad(sch)
    logger.debug("scheduled %s with %s", conv_name, values)


def accumulate_conv(sch: Schedule, conv: Any) -> tuple[Any, Any]:
    """Inline the conv's elementwise prologue (but the padding) and its epilogue but the
    last block, give it a local accumulator (:func:`accumulate_locally`) and return it with
    the block that stores the output."""
    tail = _tail(sch, conv)
    if tail is None:
        raise ValueError("an epilogue block is not elementwise over the conv's output")
    conv_name = sch.get(conv).name_hint
    for name in [*(elementwise_prologue(sch, conv, keep=(_PAD,)) or []), *tail[:-1]]:
        sch.compute_inline(sch.get_sblock(name))
    return accumulate_locally(sch, conv_name, tail)


def schedule_pad(sch: Schedule) -> None:
    """The padding, where the task pads in its own pass: parallel over (batch, channel
    blocks, rows), vectorized along the channel block."""
    if _has_pad(sch):
        pad_loops = sch.get_loops(sch.get_sblock(_PAD))
        sch.parallel(sch.fuse(*pad_loops[:3]))
        sch.vectorize(pad_loops[-1])


X86_CONV2D_NCHWC_DOT = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="conv2d NCHW16c + epilogue on vdpbf16ps (bf16) or vpdpbusd (uint8 x int8), register tile (x86)",
    starts=_starts,
))
