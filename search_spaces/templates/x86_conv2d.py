"""``x86-conv2d-nchw``: direct NCHW conv2d (+ fused elementwise epilogue) for x86 CPUs.

The classic register-blocked direct convolution: each thread owns a tile of output
channels x rows x columns; the tile's accumulators live in vector registers (columns
vectorized, channels and rows unrolled), every weight is broadcast once per tile row and
every input vector is reused across the tile's channels. The epilogue (bias, batch norm,
residual add, relu...) is applied to the tile while it is still in registers.
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.templates.blocks import iter_kinds, root_blocks
from search_spaces.templates.registry import Template, register_template

NAME = "x86-conv2d-nchw"
_CONV_PREFIX = "conv2d_nchw"
# Vector registers the accumulators may take: AVX-512 and AVX2 both have 16 or 32; the
# rest hold the broadcast weights and the input vectors.
_ACC_REGISTERS = 24


def _conv_block(sch: Schedule) -> Any | None:
    found = [b for b in root_blocks(sch) if sch.get(b).name_hint.startswith(_CONV_PREFIX)]
    if len(found) != 1:
        return None
    kinds = iter_kinds(sch, found[0])
    return found[0] if kinds == "SSSSRRR" else None


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    conv = _conv_block(sch)
    if conv is None:
        return None
    extents = [int(sch.get(loop).extent) for loop in sch.get_loops(conv)]
    if len(extents) != 7 or extents[0] != 1:
        return None
    _, co, h, w, ci, _, _ = extents
    return (
        Knob("tile_co", "choice", tuple(d for d in divisors(co) if d <= 32)),
        Knob("tile_h", "choice", tuple(d for d in divisors(h) if d <= 4)),
        Knob("tile_w", "choice", tuple(d for d in divisors(w) if d <= 64)),
        Knob("tile_ci", "choice", tuple(d for d in divisors(ci) if d <= 64)),
        # 0: kernel window outside the channel block (ci_o, kh, kw, ci_i); 1: inside.
        Knob("window_inner", "choice", (0, 1)),
    )


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    lanes = limits.vector_bits // 32
    regs = values["tile_co"] * values["tile_h"] * math.ceil(values["tile_w"] / lanes)
    if regs > _ACC_REGISTERS:
        return f"register tile needs {regs} vector registers, more than {_ACC_REGISTERS}"
    if values["tile_w"] * values["tile_co"] * values["tile_h"] < lanes:
        return "register tile smaller than one vector"
    return None


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    conv = _conv_block(sch)
    if conv is None:
        raise ValueError("no conv2d_nchw block")
    conv_name = sch.get(conv).name_hint
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    # Everything after the conv is an elementwise chain: inline it into the last block, the
    # one that writes the function's output.
    tail = names[names.index(conv_name) + 1:]
    for name in tail[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    # The pad stage stays a separate, parallel pass: inlined, its bounds test sits in the
    # inner loop and keeps LLVM from vectorizing the input loads.
    pad = "pad_temp" if "pad_temp" in names else None

    conv = sch.get_sblock(conv_name)
    n, co, h, w, ci, kh, kw = sch.get_loops(conv)
    co_o, co_i = sch.split(co, [None, values["tile_co"]])
    h_o, h_i = sch.split(h, [None, values["tile_h"]])
    w_o, w_i = sch.split(w, [None, values["tile_w"]])
    ci_o, ci_i = sch.split(ci, [None, values["tile_ci"]])
    if values["window_inner"]:
        sch.reorder(n, co_o, h_o, w_o, ci_o, ci_i, kh, kw, co_i, h_i, w_i)
    else:
        sch.reorder(n, co_o, h_o, w_o, ci_o, kh, kw, ci_i, co_i, h_i, w_i)
    if tail:
        sch.reverse_compute_at(sch.get_sblock(tail[-1]), w_o)
    # Accumulate the tile in a compact local buffer that LLVM keeps in registers.
    sch.set_scope(conv, 0, "local")
    outer = sch.fuse(n, co_o, h_o)
    sch.parallel(outer)
    sch.unroll(co_i)
    sch.unroll(h_i)
    sch.vectorize(w_i)
    if tail:
        epi_loops = sch.get_loops(sch.get_sblock(tail[-1]))
        sch.vectorize(epi_loops[-1])
    # Parallel and vectorize need the reduction block whole; split its init off last.
    init = sch.decompose_reduction(conv, ci_o)
    init_loops = sch.get_loops(init)
    sch.vectorize(init_loops[-1])
    if pad is not None:
        pad_loops = sch.get_loops(sch.get_sblock(pad))
        sch.parallel(sch.fuse(*pad_loops[:2]))
        sch.vectorize(pad_loops[-1])


X86_CONV2D_NCHW = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="direct NCHW conv2d + epilogue, register-blocked, vectorized along width (x86)",
))
