"""``x86-depthwise-conv2d-nchw`` and ``-nchwc``: depthwise conv2d (+ fused epilogue) for x86 CPUs.

MobileNet's depthwise convs, as Relax legalizes them: a block ``group_conv2d_nchw`` (or
``depthwise_conv2d_nchw``) whose channel reduction has extent 1, so every output channel
reads only its own input channel. There is no reuse across channels to exploit; the
schedule keeps a tile of ``tile_c`` channels x ``tile_h`` rows x ``tile_w`` columns of
accumulators in registers (columns vectorized), broadcasts each of the KHxKW weights once
per channel and row, and applies the epilogue to the tile in registers. The op is memory
bound, so the knobs are mostly about how many input rows a tile shares (``tile_h``) and
how wide its vector loads are.

In the blocked layout (``tuner.graph.layout.ops.depthwise_conv2d_nchwc``: block
``depthwise_conv2d_NCHWc``, iters n, chunk, oh, ow, lane; reduce kh, kw) the channel block
is the vector: no broadcasts, one weight vector per chunk and window position FMA'd into a
tile of ``tile_c`` chunks x ``tile_h`` rows x ``tile_w`` columns of accumulators. That is
what keeps MobileNet's depthwise convs in the NCHW8c/16c of their neighbours, without a
layout transform on each side.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.templates.blocks import accumulate_locally, elementwise_tail, iter_kinds, root_blocks
from search_spaces.templates.registry import Template, register_template

logger = logging.getLogger(__name__)

NAME = "x86-depthwise-conv2d-nchw"
_PREFIXES = ("group_conv2d_nchw", "depthwise_conv2d_nchw")
_PADS = ("pad_temp", "PaddedInput")
# Vector registers the accumulators may take; the rest hold inputs and broadcast weights.
_ACC_REGISTERS = 24


def _conv_block(sch: Schedule) -> Any | None:
    found = [b for b in root_blocks(sch) if sch.get(b).name_hint.startswith(_PREFIXES)]
    if len(found) != 1:
        return None
    kinds = iter_kinds(sch, found[0])
    if kinds == "SSSSRRR":
        # Depthwise: the channel reduction (the first reduce iter) has extent 1.
        if int(sch.get(found[0]).iter_vars[4].dom.extent) != 1:
            return None
    elif kinds != "SSSSRR":
        return None
    return found[0]


def _tail(sch: Schedule, conv: Any, spatial: int = 4) -> list[str] | None:
    """The epilogue blocks after the conv (``spatial`` output dims: 4 NCHW, 5 NCHW[x]c), or
    None when a block before it is not padding or one after it is not elementwise over it."""
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    conv_name = sch.get(conv).name_hint
    if any(n not in _PADS for n in names[:names.index(conv_name)]):
        return None
    return elementwise_tail(sch, conv, spatial)


def _prologue(sch: Schedule, conv: Any, spatial: int, values: dict[str, Any]) -> tuple[Any, Any, list[str]]:
    """Inline the epilogue into its last block and (``pad_inline``) the padding into the
    conv; returns the conv (accumulating in registers), the block that stores the tile, and
    the padding blocks left."""
    tail = _tail(sch, conv, spatial)
    if tail is None:
        raise ValueError("an epilogue block is not elementwise over the conv's output")
    conv_name = sch.get(conv).name_hint
    for name in tail[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    pads = [sch.get(b).name_hint for b in root_blocks(sch) if sch.get(b).name_hint in _PADS]
    if pads and values["pad_inline"]:
        sch.compute_inline(sch.get_sblock(pads[0]))
        pads = []
    conv, store = accumulate_locally(sch, conv_name, tail)
    return conv, store, pads


def _parallel_pad(sch: Schedule, pads: list[str], outer: int) -> None:
    """A padding pass of its own: its ``outer`` loops in parallel, the innermost vectorized."""
    if pads:
        pad_loops = sch.get_loops(sch.get_sblock(pads[0]))
        sch.parallel(sch.fuse(*pad_loops[:outer]))
        sch.vectorize(pad_loops[-1])


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    conv = _conv_block(sch)
    if conv is None or _tail(sch, conv) is None:
        return None
    _, c, h, w, *window = (int(sch.get(loop).extent) for loop in sch.get_loops(conv))
    lanes = limits.vector_bits // 32
    has_pad = any(sch.get(b).name_hint in _PADS for b in root_blocks(sch))
    return (
        Knob("tile_c", "choice", tuple(d for d in divisors(c) if d <= 8)),
        Knob("tile_h", "choice", tuple(d for d in divisors(h) if d <= 4)),
        # Within one vector, or whole vectors (a wider odd-sized vector legalizes badly).
        Knob("tile_w", "choice", tuple(d for d in divisors(w) if d <= lanes or (d % lanes == 0 and d <= 4 * lanes))),
        Knob("unroll_kw", "choice", (1, window[-1]) if window[-1] > 1 else (1,)),
        # 0: padding is its own parallel pass; 1: inlined into the conv's loads.
        Knob("pad_inline", "choice", (0, 1) if has_pad else (0,)),
        Knob("lanes", "choice", (lanes,)),
    )


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    regs = values["tile_c"] * values["tile_h"] * math.ceil(values["tile_w"] / values["lanes"])
    if regs > _ACC_REGISTERS:
        return f"register tile needs {regs} vector registers, more than {_ACC_REGISTERS}"
    if values["tile_c"] * values["tile_h"] * values["tile_w"] < values["lanes"]:
        return "register tile smaller than one vector"
    return None


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    conv = _conv_block(sch)
    if conv is None:
        raise ValueError("no depthwise conv2d block")
    conv, store, pads = _prologue(sch, conv, 4, values)
    n, c, h, w, *reduction = sch.get_loops(conv)
    c_o, c_i = sch.split(c, [None, values["tile_c"]])
    h_o, h_i = sch.split(h, [None, values["tile_h"]])
    vec = min(values["tile_w"], values["lanes"])
    w_o, w_v, w_i = sch.split(w, [None, values["tile_w"] // vec, vec])
    sch.reorder(n, c_o, h_o, w_o, *reduction, c_i, h_i, w_v, w_i)
    sch.reverse_compute_at(store, w_o)
    sch.parallel(sch.fuse(n, c_o, h_o))
    if values["unroll_kw"] > 1:
        sch.unroll(reduction[-1])
    sch.unroll(c_i)
    sch.unroll(h_i)
    sch.unroll(w_v)
    sch.vectorize(w_i)
    epi = sch.get_loops(store)
    e_o, e_i = sch.split(epi[-1], [None, vec])
    sch.unroll(e_o)
    sch.vectorize(e_i)
    init = sch.decompose_reduction(conv, reduction[0])
    init_loops = sch.get_loops(init)
    sch.unroll(init_loops[-2])
    sch.vectorize(init_loops[-1])
    _parallel_pad(sch, pads, 2)
    logger.debug("scheduled %s with %s", sch.get(conv).name_hint, values)


X86_DEPTHWISE_CONV2D_NCHW = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="depthwise NCHW conv2d + epilogue, register tile of channels x rows x vectors of columns (x86)",
))


# ----------------------------------------------------------------------------- NCHW[x]c

NCHWC_NAME = "x86-depthwise-conv2d-nchwc"
_NCHWC_PREFIX = "depthwise_conv2d_NCHWc"
# Fewest accumulators: an FMA's result is ready ~4 cycles later and two issue per cycle.
_MIN_ACC_REGISTERS = 4


def _blocked_conv_block(sch: Schedule) -> Any | None:
    found = [b for b in root_blocks(sch) if sch.get(b).name_hint.startswith(_NCHWC_PREFIX)]
    if len(found) != 1 or iter_kinds(sch, found[0]) != "SSSSSRR":
        return None
    return found[0]


def _acc_registers(limits: Limits) -> int:
    """Accumulator registers: at most 24, leaving the weight vectors of a step (one per
    chunk, up to 4) and its input vector (24 of AVX-512's 32, 12 of AVX2's 16)."""
    return min(_ACC_REGISTERS, limits.vector_registers - 4)


def _blocked_knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    conv = _blocked_conv_block(sch)
    if conv is None or _tail(sch, conv, 5) is None:
        return None
    _, chunks, oh, ow, block, _, kw = (int(sch.get(loop).extent) for loop in sch.get_loops(conv))
    lanes = limits.vector_bits // 32
    if block > lanes and block % lanes:  # a block above the lanes splits into whole vectors
        return None
    cap = _acc_registers(limits)
    has_pad = any(sch.get(b).name_hint in _PADS for b in root_blocks(sch))
    return (
        # The register tile: tile_c channel chunks x tile_h rows x tile_w columns, each
        # accumulator one channel block (the vector).
        Knob("tile_c", "choice", tuple(d for d in divisors(chunks) if d <= 4)),
        Knob("tile_h", "choice", tuple(d for d in divisors(oh) if d <= 4)),
        Knob("tile_w", "choice", tuple(d for d in divisors(ow) if d <= cap)),
        Knob("unroll_kw", "choice", (1, kw) if kw > 1 else (1,)),
        # Loops fused into the parallel loop: (n, chunk tiles), + row tiles.
        Knob("parallel_depth", "choice", (2, 3)),
        Knob("pad_inline", "choice", (0, 1) if has_pad else (0,)),
        # Fixed by the layout and the target; knobs so the constraint can read them.
        Knob("block", "choice", (block,)),
        Knob("lanes", "choice", (lanes,)),
    )


def _blocked_registers(values: dict[str, Any]) -> int:
    """Vector registers the blocked template's accumulator tile takes."""
    return values["tile_c"] * values["tile_h"] * values["tile_w"] * math.ceil(values["block"] / values["lanes"])


def _blocked_constraint(values: dict[str, Any], limits: Limits) -> str | None:
    regs, cap = _blocked_registers(values), _acc_registers(limits)
    if regs > cap:
        return f"register tile needs {regs} vector registers, more than {cap}"
    if regs < _MIN_ACC_REGISTERS:
        return f"register tile of {regs} vector registers, fewer than {_MIN_ACC_REGISTERS}"
    return None


def _blocked_schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    conv = _blocked_conv_block(sch)
    if conv is None:
        raise ValueError("no depthwise_conv2d_NCHWc block")
    conv, store, pads = _prologue(sch, conv, 5, values)
    n, c, h, w, block, kh, kw = sch.get_loops(conv)
    c_o, c_i = sch.split(c, [None, values["tile_c"]])
    h_o, h_i = sch.split(h, [None, values["tile_h"]])
    w_o, w_i = sch.split(w, [None, values["tile_w"]])
    # One weight vector per (channel chunk, kh, kw), FMA'd into every pixel of the tile.
    sch.reorder(n, c_o, h_o, w_o, kh, kw, c_i, h_i, w_i, block)
    sch.reverse_compute_at(store, w_o)
    sch.parallel(sch.fuse(*[n, c_o, h_o][:values["parallel_depth"]]))
    if values["unroll_kw"] > 1:
        sch.unroll(kw)
    for loop in (c_i, h_i, w_i):
        sch.unroll(loop)
    vec = min(values["block"], values["lanes"])
    if values["block"] > vec:
        b_o, b_i = sch.split(block, [None, vec])
        sch.unroll(b_o)
        block = b_i
    sch.vectorize(block)
    epi = sch.get_loops(store)
    e_o, e_i = sch.split(epi[-1], [None, vec])
    sch.unroll(e_o)
    sch.vectorize(e_i)
    init = sch.decompose_reduction(conv, kh)
    sch.vectorize(sch.get_loops(init)[-1])
    _parallel_pad(sch, pads, 3)
    logger.debug("scheduled %s with %s", sch.get(conv).name_hint, values)


X86_DEPTHWISE_CONV2D_NCHWC = register_template(Template(
    name=NCHWC_NAME,
    knobs=_blocked_knobs,
    schedule=_blocked_schedule,
    constraint=_blocked_constraint,
    description="depthwise NCHW[x]c conv2d + epilogue, register tile of channel blocks x rows x columns (x86)",
))
