"""``x86-conv2d-amx``: blocked stride-1 and stride-2 conv2d on Intel AMX tiles
(``tdpbf16ps`` for bf16, ``tdpbusd`` for uint8 x int8), + epilogue.

The task is the one of ``x86-conv2d-nchwc-dot`` (:mod:`.x86_conv2d_nchwc_dot`): block
``conv2d_NCHWc_dot`` over ``NCHW{b}c`` data with weights packed ``OIHW{b/e}i16o{e}i``, whose
rows of 16 output channels x ``e`` input channels are 64 bytes: one row of an AMX B tile.
An accumulator tile is ``rows`` output pixels of one output row x one output channel block
of 16; the register tile is ``tile_oc`` of them side by side (the same pixels). One
reduction step is one input channel block at one kernel tap: an A tile of ``rows`` input
pixels, ``b`` channels each, that a conv reads at a constant stride (the block's ``b``
elements, times the conv's stride along the row), and ``tile_oc`` B tiles. The
accumulators stay in the tile registers across every channel block and tap
(:mod:`.intrin_amx`); the epilogue then runs from a local copy, vectorized.

``rows`` divides the output row (7, 8, 14 or 16 pixels: tiles of fewer than 16 rows are
fine for AMX, each row of A is one step of the tile multiply), so no tile is partial. An
``NCHW16c`` block fills only half of a bf16 A row (a quarter of a uint8 one), and a tile
multiply costs the same cycles whatever part of the row it uses
(``benchmarks/amx_conv_steps.py``): a conv whose input is padded by another function reads
it in a wide block that fills the row, 32 bf16 or 64 uint8 channels
(:func:`tuner.graph.layout.plan.wide_blocks`), and so does half (a quarter of) the tile multiplies; so
does a stride-1 1x1 conv whose input nothing else reads, written so by its producer.

Strides other than 1 and 2, and rows that none of the tile heights divide, stay on the
AVX-512 template.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule
from tvm.sym.pattern import detect_linear_equation

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob
from search_spaces.templates.registry import Template, register_template
from search_spaces.templates.x86_conv2d_nchwc_dot import _conv_block, _tail, accumulate_conv, schedule_pad
from search_spaces.x86.intrin_amx import (
    AMX_DOTS,
    CONV_BLOCK,
    CONV_ROWS,
    CONV_STRIDES,
    AmxInstruction,
    TileShape,
    conv_blocks,
    conv_update,
    copy_accumulators,
    register_amx_intrinsics,
    target_has_amx,
)

logger = logging.getLogger(__name__)

NAME = "x86-conv2d-amx"
_TILE_OC = (1, 2, 3)


def _instruction(sch: Schedule, conv: Any) -> tuple[AmxInstruction, int, int] | None:
    """The AMX instruction for the conv's (data, weight) dtypes, the conv's stride along the
    row (one of :data:`CONV_STRIDES`) and its input channel block (one of
    :func:`~.intrin_amx.conv_blocks`: ``NCHW16c`` data, or a wide block), or None."""
    stmt = sch.get(conv)
    reads = stmt.reads
    inst = AMX_DOTS.get(tuple(str(r.source.dtype) for r in reads)) if len(reads) == 2 else None
    if inst is None:
        return None
    *_, groups, lanes = (int(sch.get(loop).extent) for loop in sch.get_loops(conv))
    data = reads[0].source
    block = int(data.shape[-1])
    if lanes != inst.elements or groups * lanes != block or block not in conv_blocks(inst):
        return None
    stride = _row_stride(stmt, data)
    return (inst, stride, block) if stride in CONV_STRIDES else None


def _row_stride(stmt: Any, data: Any) -> int | None:
    """How many input pixels apart the conv reads two neighbouring output pixels of a row:
    the coefficient of the output column in the data's column index (the block's read
    region of the data, in its iteration variables)."""
    column = stmt.iter_vars[3].var
    region = next(r.region for r in stmt.reads if r.source.same_as(data))
    coeffs = detect_linear_equation(region[3].min, [column])
    return int(coeffs[0]) if len(coeffs) == 2 and isinstance(coeffs[0], tvm.tirx.IntImm) else None


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    sch = Schedule(mod)
    conv = _conv_block(sch)
    if conv is None or _tail(sch, conv) is None:
        return None
    found = _instruction(sch, conv)
    if found is None or not target_has_amx(target, found[0]):
        return None
    _, oc_chunks, _, ow, oc_block, *_ = (int(sch.get(loop).extent) for loop in sch.get_loops(conv))
    rows = tuple(r for r in CONV_ROWS if ow % r == 0)
    if oc_block != CONV_BLOCK or not rows:
        return None
    return (
        Knob("rows", "choice", rows),
        Knob("tile_oc", "choice", tuple(t for t in _TILE_OC if oc_chunks % t == 0)),
        # 0: output channel tiles outermost; 1: pixel rows outermost.
        Knob("order", "choice", (0, 1)),
        # 0: channel blocks outside the kernel taps; 1: taps outside.
        Knob("reduce_order", "choice", (0, 1)),
        Knob("parallel_depth", "choice", (1, 2, 3)),
    )


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    register_amx_intrinsics()
    conv = _conv_block(sch)
    found = None if conv is None else _instruction(sch, conv)
    if conv is None or found is None:
        raise ValueError("no stride-1 or -2 conv2d_NCHWc_dot block over NCHW16c (or wide-block) bfloat16 "
                         "or uint8 x int8 data")
    inst, stride, block = found
    conv_name = sch.get(conv).name_hint
    conv, store = accumulate_conv(sch, conv)
    shape = TileShape(1, values["tile_oc"], values["rows"], block)
    n, oc, oh, ow, oc_block, kh, kw, ic_chunk, ic_group, ic_lane = sch.get_loops(conv)
    oc_o, oc_i = sch.split(oc, [None, shape.tn])
    ow_o, ow_i = sch.split(ow, [None, shape.rows])
    outer = [n, oc_o, oh, ow_o] if values["order"] == 0 else [n, oh, ow_o, oc_o]
    reduction = [ic_chunk, kh, kw] if values["reduce_order"] == 0 else [kh, kw, ic_chunk]
    sch.reorder(*outer, *reduction, oc_i, ow_i, oc_block, ic_group, ic_lane)
    sch.reverse_compute_at(store, outer[-1])
    copy = copy_accumulators(sch, conv, store)
    sch.parallel(sch.fuse(*outer[:values["parallel_depth"] + 1]))
    init = sch.decompose_reduction(conv, reduction[0])
    sch.tensorize(oc_i, conv_update(inst, shape, stride))
    sch.tensorize(sch.get_loops(init)[-3], inst.intrin("init", shape))
    oc_c, row_c, pixels_c, _ = sch.get_loops(copy)[-4:]
    sch.fuse(row_c, pixels_c)  # the unit output row, which the intrinsic has no loop for
    sch.tensorize(oc_c, inst.intrin("store", shape))
    epi = sch.get_loops(store)
    sch.vectorize(epi[-1])
    schedule_pad(sch)
    logger.debug("scheduled %s with %s", conv_name, values)


X86_CONV2D_AMX = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    description="stride-1/2 conv2d NCHW16c + epilogue on AMX tiles: tdpbf16ps (bf16), tdpbusd (uint8 x int8) (x86)",
))
