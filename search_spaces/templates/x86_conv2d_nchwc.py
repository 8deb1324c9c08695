"""``x86-conv2d-nchwc``: conv2d in the blocked NCHW[x]c layout (+ fused epilogue) for x86.

The classic register-tiled direct convolution of TVM's old ``topi.x86`` ``conv2d_NCHWc``
schedules: the output channel block (``oc_block``, fixed by the layout) is the vector, a
tile of ``tile_oh x reg_n`` output pixels of ``tile_oc`` channel blocks are its
accumulators, held in registers (local scope, vectorized along ``oc_block``, unrolled along
the pixels and blocks) for the whole reduction. Every input element is broadcast once and
multiplied into ``tile_oc`` weight vectors (oneDNN's ``nb_oc_blocking``): with AVX2's
8-lane blocks one broadcast per FMA leaves the load ports, not the FMA units, the limit.
The epilogue (bias, residual add, relu...) is applied to the tile while it is still in
registers.

The pixels of the tile are either a ``tile_oh x reg_n`` rectangle (``reg_n`` dividing the
row) or, with ``fuse_pixels``, ``reg_n`` consecutive pixels of the fused (oh, ow) axis: 4
pixels of a 14-wide map run across rows, and 5 or 6 pixels tile a 7x7 map as oneDNN and MLAS
tile it, with a shorter last tile. Rectangles on ResNet-50's 7-, 14- and 28-wide maps can
only have 1, 2, 4, 7, 8 or 14 pixels. Where ``reg_n`` does not divide the pixel count the
pixel loop stays serial (``parallel_depth`` 2) and carries TVM's
``pragma_loop_partition_hint``, so the last tile is peeled and the full ones run without a
bounds check; :mod:`search_spaces.lowering` makes that hint work on Relax's int64 tasks. On
ResNet-50's conv tasks the best fused tile, mostly 5 or 6 pixels x 2 channel blocks, took
0.64-0.93x the time of the best rectangle (caches flushed) on five of six shapes, and 1.02x
on the 28x28 3x3 (AVX2, 2026-11-25; benchmarks/README.md, "Partial pixel tiles, peeled").

The task is what ``topi.nn.conv2d_NCHWc`` gives: a block ``conv2d_NCHWc`` with spatial
iters (n, oc_chunk, oh, ow, oc_block) and reduce iters (ic, kh, kw), ``ic`` the fused
input channel (chunk * ic_block + lane); an optional ``data_pad`` block before it;
elementwise epilogue blocks after it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

import tvm
from tvm.s_tir import Schedule
from tvm.tirx import IndexMap

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.lowering import HINT
from search_spaces.templates.blocks import accumulate_locally, elementwise_tail, iter_kinds, root_blocks
from search_spaces.templates.registry import Template, register_template

logger = logging.getLogger(__name__)

NAME = "x86-conv2d-nchwc"
_CONV_PREFIX = "conv2d_NCHWc"
_PAD = "data_pad"
# Vector registers the accumulators may take on AVX-512 (of 32 zmm; two per 16-lane block on
# AVX2, see _acc_budget): the rest hold the broadcast input and the weight vectors.
_ACC_REGISTERS = 24
# Fewest accumulators: an FMA's result is ready ~4 cycles later and two issue per cycle, so
# fewer independent accumulators leave the FMA units idle.
_MIN_ACC_REGISTERS = 4
# Largest unrolled reduction body (FMAs per unrolled step): beyond it LLVM's build time
# grows faster than the kernel improves.
_MAX_UNROLLED_FMAS = 1024
# Reduction orders: where the kernel window sits relative to the input-channel loops.
#   0: ic_o, kh, kw, ic_i  (topi's unroll_kw=False)   1: ic_o, kh, ic_i, kw  (unroll_kw=True)
#   2: kh, kw, ic_o, ic_i  (window outermost: each weight slab streamed once per tile)
_ORDERS = (0, 1, 2)


def _conv_block(sch: Schedule) -> Any | None:
    found = [b for b in root_blocks(sch) if sch.get(b).name_hint.startswith(_CONV_PREFIX)]
    if len(found) != 1:
        return None
    return found[0] if iter_kinds(sch, found[0]) == "SSSSSRRR" else None


def _tail(sch: Schedule, conv: Any) -> list[str] | None:
    """Names of the epilogue blocks after the conv, or None when one is not elementwise
    over the conv's output shape (it could not be computed at the register tile)."""
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    conv_name = sch.get(conv).name_hint
    before = names[:names.index(conv_name)]
    if any(n != _PAD and not n.startswith(_PAD) for n in before):
        return None
    return elementwise_tail(sch, conv, 5)


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    conv = _conv_block(sch)
    if conv is None or _tail(sch, conv) is None:
        return None
    _, _, oh, ow, oc_block, _, _, kw = (int(sch.get(loop).extent) for loop in sch.get_loops(conv))
    ic_block = _ic_block(sch, conv)
    if ic_block is None:
        return None
    max_pixels = min(_acc_budget(limits) // _regs_per_pixel(oc_block, limits), oh * ow)
    if max_pixels < 1:
        return None
    oc_chunks = int(sch.get(sch.get_loops(conv)[1]).extent)
    return (
        # Output pixels of the register tile: reg_n along the row (dividing it), tile_oh
        # rows; or, with fuse_pixels, reg_n along the fused (oh, ow) axis.
        Knob("reg_n", "choice", tuple(range(1, max_pixels + 1))),
        Knob("tile_oh", "choice", tuple(d for d in divisors(oh) if d <= 4)),
        # Output channel blocks of the register tile: each broadcast feeds tile_oc FMAs.
        Knob("tile_oc", "choice", tuple(d for d in divisors(oc_chunks) if d <= 4)),
        # Input channels unrolled per step of the reduction (within one channel block).
        Knob("tile_ic", "choice", divisors(ic_block)),
        Knob("order", "choice", _ORDERS),
        # Kernel-window columns unrolled: 1 (a loop) or all of them.
        Knob("unroll_kw", "choice", (1, kw) if kw > 1 else (1,)),
        # Fixed by the layout; a knob so the register constraint can read it.
        Knob("oc_block", "choice", (oc_block,)),
        # Loops fused into the parallel loop: (n, oc_chunk), + oh tiles, + ow tiles.
        Knob("parallel_depth", "choice", (2, 3, 4)),
        # 0: padding is its own parallel pass; 1: inlined into the conv's loads.
        Knob("pad_inline", "choice", (0, 1) if _has_pad(sch) else (0,)),
        # 1: the pixel tile runs along the fused (oh, ow) axis (see the module's docstring).
        Knob("fuse_pixels", "choice", (0, 1)),
        # Fixed by the task; knobs so the constraint can read them.
        Knob("out_h", "choice", (oh,)),
        Knob("out_w", "choice", (ow,)),
    )


def _has_pad(sch: Schedule) -> bool:
    return any(sch.get(b).name_hint == _PAD for b in root_blocks(sch))


def _ic_block(sch: Schedule, conv: Any) -> int | None:
    """The input layout's channel block (the last extent of the data buffer the conv reads)."""
    block = sch.get(conv)
    for region in block.reads:
        shape = [int(d) for d in region.source.shape]
        if len(shape) == 5:
            return shape[-1]
    return None


def _regs_per_pixel(oc_block: int, limits: Limits) -> int:
    return math.ceil(oc_block / (limits.vector_bits // 32))


def _acc_budget(limits: Limits) -> int:
    """Accumulator registers: at most 24 of AVX-512's 32, and 14 of AVX2's 16, which leaves
    the broadcast input and one weight vector (further weight vectors can be FMA memory
    operands; more accumulators would spill to the stack)."""
    return min(_ACC_REGISTERS, limits.vector_registers - 2)


def _pixel_violation(values: dict[str, Any]) -> str | None:
    reg_n, ow = values["reg_n"], values["out_w"]
    if not values["fuse_pixels"]:
        return None if ow % reg_n == 0 else f"reg_n {reg_n} does not divide the row of {ow} pixels"
    if values["tile_oh"] != 1:
        return "a fused pixel tile has no tile_oh"
    if values["parallel_depth"] == 4:
        return "a fused pixel tile has no ow loop to parallelize"
    if values["out_h"] * ow % reg_n and values["parallel_depth"] != 2:
        return "a partial last pixel tile needs the pixel loop serial (parallel_depth 2) to be peeled"
    return None


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    pixels = values["reg_n"] * values["tile_oh"]
    per_pixel = _regs_per_pixel(values["oc_block"], limits) * values["tile_oc"]
    regs = pixels * per_pixel
    budget = _acc_budget(limits)
    if regs > budget:
        return f"register tile needs {regs} vector registers, more than {budget}"
    if regs < _MIN_ACC_REGISTERS:
        return f"register tile of {regs} vector registers, fewer than {_MIN_ACC_REGISTERS}"
    pixels_wrong = _pixel_violation(values)
    if pixels_wrong:
        return pixels_wrong
    body = regs * values["tile_ic"] * values["unroll_kw"]
    if body > _MAX_UNROLLED_FMAS:
        return f"unrolled reduction body of ~{body} vector FMAs, more than {_MAX_UNROLLED_FMAS}"
    return None


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    conv = _conv_block(sch)
    if conv is None:
        raise ValueError("no conv2d_NCHWc block")
    tail = _tail(sch, conv)
    if tail is None:
        raise ValueError("an epilogue block is not elementwise over the conv's output")
    conv_name = sch.get(conv).name_hint
    # The elementwise chain is inlined into its last block, the one that writes the output.
    for name in tail[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    pad = _has_pad(sch)
    if pad and values["pad_inline"]:
        sch.compute_inline(sch.get_sblock(_PAD))

    conv, store = accumulate_locally(sch, conv_name, tail)
    tiles = pixel_tiles(sch, conv, store, values)
    outer_loops, tile_loops, oc_t, oc_block, peel = tiles.outer, tiles.tile, tiles.oc_t, tiles.oc_block, tiles.peel
    ic, kh, kw = tiles.reduce
    ic_o, ic_i = sch.split(ic, [None, values["tile_ic"]])
    order = values["order"]
    if order == 0:
        reduction = [ic_o, kh, kw, ic_i]
    elif order == 1:
        reduction = [ic_o, kh, ic_i, kw]
    else:
        reduction = [kh, kw, ic_o, ic_i]
    # Pixels outside the channel blocks: one broadcast, then its tile_oc FMAs.
    sch.reorder(*outer_loops, *reduction, *tile_loops, oc_t, oc_block)
    sch.reverse_compute_at(store, outer_loops[-1])
    sch.parallel(sch.fuse(*outer_loops[:values["parallel_depth"]]))
    if peel is not None:
        sch.annotate(peel, HINT, 1)  # the shorter last tile is peeled (see the module's docstring)
    sch.unroll(ic_i)
    if values["unroll_kw"] > 1:
        sch.unroll(kw)
    for loop in tile_loops:
        sch.unroll(loop)
    sch.unroll(oc_t)
    sch.vectorize(oc_block)
    # The store's own loops follow the fused parallel loop and the unfused outer ones.
    tile = sch.get_loops(store)[1 + len(outer_loops) - values["parallel_depth"]:]
    sch.vectorize(tile[-1])
    for loop in tile[:-1]:
        sch.unroll(loop)
    # Parallel and vectorize need the reduction block whole; split its init off last.
    init = sch.decompose_reduction(conv, reduction[0])
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    if pad and not values["pad_inline"]:
        pad_loops = sch.get_loops(sch.get_sblock(_PAD))
        sch.parallel(sch.fuse(*pad_loops[:3]))
        sch.vectorize(pad_loops[-1])
    logger.debug("scheduled %s with %s", conv_name, values)


class PixelTiles(NamedTuple):
    """The conv's loops after :func:`pixel_tiles`."""

    outer: list[Any]  # (n, oc tiles, pixel tiles): the loops outside the register tile
    tile: list[Any]  # the tile's pixel loops: (oh_i, ow_i), or (pix_i) fused
    oc_t: Any  # the tile's channel blocks
    oc_block: Any  # the vector lanes
    reduce: list[Any]  # the conv's reduce loops, as they were
    peel: Any | None  # the pixel-tile loop whose last tile is partial


def pixel_tiles(sch: Schedule, conv: Any, store: Any, values: dict[str, Any]) -> PixelTiles:
    """Split the conv's (and its store's) pixels into register tiles: a ``tile_oh x reg_n``
    rectangle, or with ``fuse_pixels`` ``reg_n`` pixels of the fused (oh, ow) axis; and its
    output channel blocks into tiles of ``tile_oc``. The conv's iters are (n, c, h, w, b)
    and its reduce iters, however many."""
    peel = None
    if values["fuse_pixels"]:
        _fuse_pixel_axis(sch, conv, store, values["out_w"])
        n, oc_chunk, pix, oc_block, *reduce = sch.get_loops(conv)
        oc_o, oc_t = sch.split(oc_chunk, [None, values["tile_oc"]])
        pix_o, pix_i = sch.split(pix, [None, values["reg_n"]])
        if values["out_h"] * values["out_w"] % values["reg_n"]:
            peel = pix_o
        return PixelTiles([n, oc_o, pix_o], [pix_i], oc_t, oc_block, reduce, peel)
    n, oc_chunk, oh, ow, oc_block, *reduce = sch.get_loops(conv)
    oc_o, oc_t = sch.split(oc_chunk, [None, values["tile_oc"]])
    oh_o, oh_i = sch.split(oh, [None, values["tile_oh"]])
    ow_o, ow_i = sch.split(ow, [None, values["reg_n"]])
    return PixelTiles([n, oc_o, oh_o, ow_o], [oh_i, ow_i], oc_t, oc_block, reduce, peel)


def _fuse_pixel_axis(sch: Schedule, conv: Any, store: Any, ow: int) -> None:
    """Give the conv, its accumulators and the store one pixel axis ``h * ow + w``, so that a
    split of it is an exact tile of every block (a split of fused loops alone would leave
    the accumulator buffer and the store's loops spanning whole rows). The conv's iters are
    (n, c, h, w, b) and its reduce iters, however many (3 here, 5 on the dot template)."""
    sch.transform_layout(conv, ("write", 0), lambda n, c, h, w, b: (n, c, h * ow + w, b))
    block = sch.get(conv)
    sch.transform_block_layout(conv, IndexMap.from_func(
        lambda n, c, h, w, b, *reduce: (n, c, h * ow + w, b, *reduce),
        ndim=len(block.iter_vars), index_dtype=str(block.iter_vars[0].var.ty)))
    sch.transform_block_layout(store, lambda n, c, h, w, b: (n, c, h * ow + w, b))


X86_CONV2D_NCHWC = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="conv2d NCHW[x]c + epilogue, register tile of pixels x oc_block lanes (x86)",
))
