"""``x86-dense-bf16``: bf16 matmul by a packed weight (+ float32 epilogue) with ``vdpbf16ps``.

The task is what :mod:`tuner.precision.bf16` makes of a dense layer: a block
``matmul_bf16`` with spatial iters (batch..., m, n) and two reduce iters (ko, ki), ki of
extent 2, reading A[..., m, 2 ko + ki] (bfloat16) and W[ko, n, ki] (bfloat16, packed at
compile time), accumulating in float32; then elementwise epilogue blocks.

The micro-kernel is the one of ``x86-dense`` with the FMA replaced by the dot-product
instruction: for each pair of reduction elements, the pair of A is broadcast (one 32-bit
lane) and multiplied with 16 column pairs of W (one 512-bit load), the 16 float32 sums
of a tile's register accumulating 2 products each (tensor intrinsic
``dot_16x2_bf16_avx512_local``). The register tile is ``tile_m`` rows x ``tile_n`` columns.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.templates import Template, register_template
from search_spaces.templates.blocks import accumulate_locally, elementwise_tail, iter_kinds, root_blocks
from search_spaces.templates.intrin_x86 import BF16_DOT_16x2_LOCAL_INTRIN, register_intrinsics, target_has_bf16_dot

logger = logging.getLogger(__name__)

NAME = "x86-dense-bf16"
_PREFIX = "matmul_bf16"
# float32 lanes of the intrinsic's accumulator (one zmm register).
_LANES = 16
_PAIR = 2
# As in x86-dense: accumulators may take 24 of the 32 zmm registers; fewer than 4 leave
# the dot-product units waiting on the previous result.
_ACC_REGISTERS = 24
_MIN_ACC_REGISTERS = 4
_MAX_UNROLLED_DOTS = 512


def _matmul_block(sch: Schedule) -> Any | None:
    blocks = root_blocks(sch)
    found = [b for b in blocks if sch.get(b).name_hint.startswith(_PREFIX)]
    if len(found) != 1 or sch.get(blocks[0]).name_hint != sch.get(found[0]).name_hint:
        return None
    kinds = iter_kinds(sch, found[0])
    if len(kinds) < 4 or kinds != "S" * (len(kinds) - 2) + "RR":
        return None
    stmt = sch.get(found[0])
    if int(stmt.iter_vars[-1].dom.extent) != _PAIR or len(stmt.reads) != 2:
        return None
    if any(str(r.source.dtype) != "bfloat16" for r in stmt.reads):
        return None
    return found[0]


def _tail(sch: Schedule, block: Any) -> list[str] | None:
    return elementwise_tail(sch, block, len(sch.get_loops(block)) - 2)


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if not target_has_bf16_dot(target):
        return None
    sch = Schedule(mod)
    block = _matmul_block(sch)
    if block is None or _tail(sch, block) is None:
        return None
    *_, m, n, half, _ = (int(sch.get(loop).extent) for loop in sch.get_loops(block))
    if n % _LANES:
        return None
    return (
        Knob("tile_m", "choice", tuple(d for d in divisors(m) if d <= _ACC_REGISTERS)),
        Knob("tile_n", "choice", tuple(_LANES * r for r in (1, 2, 3, 4) if n % (_LANES * r) == 0)),
        # Column tiles per panel of W kept in cache, in vectors (a divisor of n / 16).
        Knob("panel", "choice", tuple(d for d in divisors(n // _LANES) if d <= 16)),
        # Pairs of the reduction unrolled per step.
        Knob("unroll_k", "choice", tuple(d for d in divisors(half) if d <= 8)),
        # 0: panels outermost; 1: row tiles outermost.
        Knob("order", "choice", (0, 1)),
        Knob("parallel_depth", "choice", (1, 2)),
    )


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    regs = values["tile_m"] * values["tile_n"] // _LANES
    if regs > _ACC_REGISTERS:
        return f"register tile needs {regs} vector registers, more than {_ACC_REGISTERS}"
    if regs < _MIN_ACC_REGISTERS:
        return f"register tile of {regs} vector registers, fewer than {_MIN_ACC_REGISTERS}"
    if (values["panel"] * _LANES) % values["tile_n"]:
        return "a panel is not a whole number of column tiles"
    if regs * values["unroll_k"] > _MAX_UNROLLED_DOTS:
        return f"unrolled body of {regs * values['unroll_k']} dot products, more than {_MAX_UNROLLED_DOTS}"
    return None


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    register_intrinsics()
    block = _matmul_block(sch)
    if block is None:
        raise ValueError("no matmul_bf16 block")
    tail = _tail(sch, block)
    if tail is None:
        raise ValueError("an epilogue block is not elementwise over the matmul's output")
    name = sch.get(block).name_hint
    for t in tail[:-1]:
        sch.compute_inline(sch.get_sblock(t))
    block, store = accumulate_locally(sch, name, tail)
    *batch, i, j, ko, ki = sch.get_loops(block)
    tile_n = values["tile_n"]
    panel_tiles = values["panel"] * _LANES // tile_n
    i_o, i_i = sch.split(i, [None, values["tile_m"]])
    j_oo, j_o, j_v, j_i = sch.split(j, [None, panel_tiles, tile_n // _LANES, _LANES])
    k_o, k_i = sch.split(ko, [None, values["unroll_k"]])
    outer = [j_oo, i_o, j_o] if values["order"] == 0 else [i_o, j_oo, j_o]
    sch.reorder(*batch, *outer, k_o, k_i, i_i, j_v, j_i, ki)
    sch.reverse_compute_at(store, outer[-1])
    sch.parallel(sch.fuse(*batch, *outer[:values["parallel_depth"]]))
    init = sch.decompose_reduction(block, k_o)
    sch.tensorize(j_i, BF16_DOT_16x2_LOCAL_INTRIN)
    sch.unroll(k_i)
    sch.unroll(i_i)
    sch.unroll(j_v)
    epi = sch.get_loops(store)
    j_e_o, j_e_i = sch.split(epi[-1], [None, _LANES])
    sch.vectorize(j_e_i)
    sch.unroll(j_e_o)
    init_loops = sch.get_loops(init)
    sch.unroll(init_loops[-2])
    sch.vectorize(init_loops[-1])
    logger.debug("scheduled %s with %s", name, values)


X86_DENSE_BF16 = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="bf16 matmul by a packed weight + epilogue, vdpbf16ps register tile (x86 AVX512_BF16)",
))
