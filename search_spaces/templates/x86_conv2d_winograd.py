"""``x86-conv2d-winograd``: a Winograd F(m, 3) conv in NCHW[x]c (+ fused epilogue) for x86.

The task is :func:`tuner.graph.winograd.conv2d_nchwc_winograd`'s compute followed by the conv's
elementwise epilogue. Four passes, each parallel over the threads:

1. ``data_pack``: each input tile's transform ``B^T d B``, its row half (``wino_rows``)
   computed per tile and channel block, vectorized along the channel block; the padding
   inlined into its loads or a pass of its own (``pad_inline``).
2. ``bgemm``: ``(m+2)^2`` GEMMs, register-tiled as the direct conv's template tiles pixels:
   ``tile_p`` tiles x ``tile_oc`` output channel blocks of accumulators, each broadcast of a
   transformed input value feeding ``tile_oc`` FMAs, ``tile_ci`` input channels unrolled.
3. ``inverse``: each output tile's ``A^T M A``, vectorized along the output channel block.
4. The output put back in ``NCHW[x]c`` order with the epilogue applied.

A bf16 model's F(2, 3) (:func:`tuner.graph.winograd.transform_weight_dot`) runs its GEMMs on
``vdpbf16ps``: the same register tile, each step a pair of input channels (one broadcast
32-bit lane of ``data_pack``'s bf16 bits) times 16 output channels' pairs (one 512-bit load),
``tile_ci`` pairs unrolled.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.templates.blocks import elementwise_tail, root_blocks
from search_spaces.templates.registry import Template, register_template
from search_spaces.templates.x86_conv2d_nchwc import _acc_budget, _regs_per_pixel
from search_spaces.x86.intrin import (
    BF16_FEATURE,
    DOT_LANES,
    BF16_BITS_DOT_16x2_LOCAL_INTRIN,
    register_intrinsics,
    target_has,
)

logger = logging.getLogger(__name__)

NAME = "x86-conv2d-winograd"
_OUTPUT = "conv2d_NCHWc_winograd"
_STAGES = ("data_pad", "wino_rows", "data_pack", "bgemm", "wino_inv_rows", "inverse", _OUTPUT)
_MIN_ACC_REGISTERS = 4
_MAX_UNROLLED_FMAS = 512


def _is_winograd(sch: Schedule) -> bool:
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    return names[:len(_STAGES)] == list(_STAGES)


def _is_dot(sch: Schedule) -> bool:
    """Whether the GEMMs are the bf16 dot product's (reduction iters chunk, pair, lane)."""
    return len(sch.get_loops(sch.get_sblock("bgemm"))) == 8


def _tail(sch: Schedule) -> list[str] | None:
    return elementwise_tail(sch, sch.get_sblock(_OUTPUT), 5)


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    if not _is_winograd(sch) or _tail(sch) is None:
        return None
    _, _, oc_chunks, tiles, oc_block, *reduction = (int(sch.get(loop).extent)
                                                    for loop in sch.get_loops(sch.get_sblock("bgemm")))
    if _is_dot(sch) and (not target_has(target, BF16_FEATURE) or oc_block != DOT_LANES):
        return None
    # Unrolled per step: input channels, or (on the dot product) pairs of them.
    channels = reduction[0] if len(reduction) == 1 else reduction[1]
    max_tiles = _acc_budget(limits) // _regs_per_pixel(oc_block, limits)
    return (
        # Tiles (of the GEMM's rows) in the register tile.
        Knob("tile_p", "choice", tuple(d for d in divisors(tiles) if d <= max_tiles)),
        # Output channel blocks of the register tile: each broadcast feeds tile_oc FMAs.
        Knob("tile_oc", "choice", tuple(d for d in divisors(oc_chunks) if d <= 4)),
        # Input channels unrolled per step of the reduction.
        Knob("tile_ci", "choice", tuple(d for d in divisors(channels) if d <= 16)),
        # 0: padding is its own parallel pass; 1: inlined into the input transform's loads.
        Knob("pad_inline", "choice", (0, 1)),
        # Fixed by the task; a knob so the constraint can read it.
        Knob("oc_block", "choice", (oc_block,)),
    )


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    regs = values["tile_p"] * values["tile_oc"] * _regs_per_pixel(values["oc_block"], limits)
    budget = _acc_budget(limits)
    if regs > budget:
        return f"register tile needs {regs} vector registers, more than {budget}"
    if regs < _MIN_ACC_REGISTERS:
        return f"register tile of {regs} vector registers, fewer than {_MIN_ACC_REGISTERS}"
    if regs * values["tile_ci"] > _MAX_UNROLLED_FMAS:
        return f"unrolled reduction body of ~{regs * values['tile_ci']} vector FMAs, more than {_MAX_UNROLLED_FMAS}"
    return None


# Register tiles every job measures first, as (tiles, output channel blocks): the bests of
# ResNet-50 bf16's four F(2, 3) tasks when every point of the space was timed on a Zen 4
# (2026-11-29, benchmarks/README.md, "Zen 4: bf16 Winograd for every 3x3 conv"): 4 x 4 at
# 28x28 and 7x7, 7 x 2 at 14x14, 1 x 4 at 56x56; 4 x 2 is in the five fastest of two of
# them. Eight random points of a space of 72-96 found none of them: the probe a job gives an
# alternative layout ran 1.3-2.3x the space's best, and the job dropped the layout. float32
# Winograd tasks start from them too (not measured there).
_START_TILES = ((4, 4), (7, 2), (1, 4), (4, 2))


def _starts(choices: dict[str, tuple], limits: Limits) -> list[dict[str, Any]]:
    """The start points: each tile, one input channel (pair) a step, the padding its own pass
    (the sweep's fastest settings). Tiles the task's tiles or channels do not take are dropped
    by the space."""
    return [{"tile_p": tiles, "tile_oc": blocks, "tile_ci": 1, "pad_inline": 0} for tiles, blocks in _START_TILES]


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    if not _is_winograd(sch):
        raise ValueError("not a Winograd conv task")
    tail = _tail(sch)
    if tail is None:
        raise ValueError("an epilogue block is not elementwise over the conv's output")
    _schedule_input(sch, values)
    _schedule_gemm(sch, values)
    _schedule_inverse(sch)
    _schedule_output(sch, tail)
    logger.debug("scheduled a Winograd conv with %s", values)


def _schedule_input(sch: Schedule, values: dict[str, Any]) -> None:
    pad = sch.get_sblock("data_pad")
    if values["pad_inline"]:
        sch.compute_inline(pad)
    else:
        loops = sch.get_loops(pad)
        sch.parallel(sch.fuse(*loops[:3]))
        sch.vectorize(loops[-1])
    _schedule_transform(sch, "data_pack", "wino_rows", tiles_first=False)


def _schedule_transform(sch: Schedule, name: str, rows: str, *, tiles_first: bool) -> None:
    """One of the two transforms, block ``name`` after its row-wise half ``rows``: parallel
    over tiles and channel blocks, a tile's two positions unrolled, the channel lanes
    vectorized; ``rows`` computed per tile and channel block, the same way. ``tiles_first``:
    the block's loops are (tiles or blocks, blocks or tiles, i, j, lanes) already, else
    (i, j, tiles, blocks, lanes)."""
    block = sch.get_sblock(name)
    if tiles_first:
        tile, chunk, i, j, lanes = sch.get_loops(block)
    else:
        i, j, tile, chunk, lanes = sch.get_loops(block)
        sch.reorder(tile, chunk, i, j, lanes)
    outer = sch.fuse(tile, chunk)
    sch.parallel(outer)
    sch.unroll(i)
    sch.unroll(j)
    sch.vectorize(lanes)
    half = sch.get_sblock(rows)
    sch.compute_at(half, outer)
    *_, r_i, r_j, r_lanes = sch.get_loops(half)
    sch.unroll(r_i)
    sch.unroll(r_j)
    sch.vectorize(r_lanes)


def _schedule_gemm(sch: Schedule, values: dict[str, Any]) -> None:
    gemm = sch.get_sblock("bgemm")
    dot = _is_dot(sch)
    store = sch.cache_write(gemm, 0, "local")
    if dot:
        eps, nu, co, p, k, chunk, ci, lane = sch.get_loops(gemm)
    else:
        eps, nu, co, p, k, ci = sch.get_loops(gemm)
    e = sch.fuse(eps, nu)
    co_o, co_t = sch.split(co, [None, values["tile_oc"]])
    p_o, p_t = sch.split(p, [None, values["tile_p"]])
    ci_o, ci_i = sch.split(ci, [None, values["tile_ci"]])
    if dot:
        sch.reorder(e, co_o, p_o, chunk, ci_o, ci_i, p_t, co_t, k, lane)
    else:
        sch.reorder(e, co_o, p_o, ci_o, ci_i, p_t, co_t, k)
    sch.reverse_compute_at(store, p_o)
    # (eps * nu, oc tiles) alone: at least 36 chunks of work, and fusing the tile rows in too
    # made LLVM take minutes over some points (a 245 s build of a 28x28 map's).
    sch.parallel(sch.fuse(e, co_o))
    if dot:
        register_intrinsics()
        init = sch.decompose_reduction(gemm, chunk)
        sch.tensorize(k, BF16_BITS_DOT_16x2_LOCAL_INTRIN)
    sch.unroll(ci_i)
    sch.unroll(p_t)
    sch.unroll(co_t)
    if not dot:
        sch.vectorize(k)
    # The store's own loops, under p_o: a register tile of one channel block (or one tile)
    # has no loop of extent 1 there, so counting from the innermost would reach p_o and
    # unroll the whole GEMM (a 56x56 map's 196 steps: 10-120 s builds, timeouts in the jobs).
    loops = sch.get_loops(store)
    depth = next(i for i, loop in enumerate(loops) if sch.get(loop).same_as(sch.get(p_o)))
    *s_tile, s_k = loops[depth + 1:]
    sch.vectorize(s_k)
    for loop in s_tile:
        sch.unroll(loop)
    if not dot:
        init = sch.decompose_reduction(gemm, ci_o)
    sch.vectorize(sch.get_loops(init)[-1])


def _schedule_inverse(sch: Schedule) -> None:
    _schedule_transform(sch, "inverse", "wino_inv_rows", tiles_first=True)


def _schedule_output(sch: Schedule, tail: list[str]) -> None:
    if tail:
        sch.compute_inline(sch.get_sblock(_OUTPUT))
        for name in tail[:-1]:
            sch.compute_inline(sch.get_sblock(name))
        last = sch.get_sblock(tail[-1])
    else:
        last = sch.get_sblock(_OUTPUT)
    n, co, y, _, k = sch.get_loops(last)
    sch.parallel(sch.fuse(n, co, y))
    sch.vectorize(k)


X86_CONV2D_WINOGRAD = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="conv2d 3x3/1 by Winograd F(m, 3) in NCHW[x]c + epilogue: transforms, register-tiled GEMMs (x86)",
    starts=_starts,
))
