"""``x86-dense-amx-bf16`` and ``x86-dense-amx-int8``: matmul by a packed weight (+ epilogue)
on Intel AMX tiles (``tdpbf16ps``, ``tdpbusd``).

The task is the one of ``x86-dense-bf16`` / ``x86-dense-vnni`` (:mod:`.x86_dense_dot`): a
block ``matmul_bf16`` (``matmul_u8s8``) reading A[..., m, e ko + ki] and the weight packed
at compile time as W[n // b, ko, n % b, ki], whose rows of 16 columns x ``e`` reduction
elements are 64 bytes: one row of an AMX B tile, so the weight needs no other layout; a
B tile's 16 rows lie ``b e`` elements apart, inside one block of ``b`` columns (64 where
they divide the columns), so ``tile_n`` B tiles side by side must fit a block. The register tile
is ``tile_m`` x ``tile_n`` accumulator tiles of 16 x 16 (up to 2 x 2: with their A and B
tiles, the 8 tile registers), kept in the tile registers across the whole reduction
(:mod:`.intrin_amx`); each reduction step loads ``tile_m`` A tiles (16 rows x 64 bytes)
and ``tile_n`` B tiles and issues ``tile_m * tile_n`` tile products. The accumulators are
stored once per register tile to a local buffer, from which the epilogue (bias, GELU,
residual; requantize for int8) writes the output, vectorized, as in ``x86-dense``.

Rows and columns must be whole tiles (BERT's 128 tokens and its 768/3072 features are);
other tasks are left to the AVX-512 templates. W may have batch dimensions (attention's
second activation, packed by ``tuner.precision.bf16``): the tiles then run one batch at a
time, the batches in parallel.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.templates.registry import Template, register_template
from search_spaces.templates.x86_dense_dot import _Dot, _matmul_block, _tail, accumulate_matmul, weight_block
from search_spaces.x86.intrin import BF16_DOT, VNNI_DOT
from search_spaces.x86.intrin_amx import (
    AMX_BF16,
    AMX_INT8,
    PREFETCH_STEPS,
    SHAPES,
    TILE,
    AmxInstruction,
    TileShape,
    copy_accumulators,
    register_amx_intrinsics,
    target_has_amx,
)

logger = logging.getLogger(__name__)

_VECTOR = 16


def _knobs(dot: _Dot, inst: AmxInstruction, mod: tvm.IRModule, target: tvm.target.Target,
           limits: Limits) -> tuple[Knob, ...] | None:
    if not target_has_amx(target, inst):
        return None
    sch = Schedule(mod)
    block = _matmul_block(sch, dot)
    if block is None or _tail(sch, block) is None:
        return None
    *_, m, n, groups, _ = (int(sch.get(loop).extent) for loop in sch.get_loops(block))
    if m % TILE or n % TILE or groups % TILE:
        return None
    # A B tile's group (tn tiles side by side) is one strided region of one column block.
    cols = weight_block(sch, block)
    shapes = [(tm, tn) for tm, tn in SHAPES if m % (tm * TILE) == 0 and cols % (tn * TILE) == 0]
    return (
        Knob("tile_m", "choice", tuple(sorted({tm for tm, _ in shapes}))),
        Knob("tile_n", "choice", tuple(sorted({tn for _, tn in shapes}))),
        # Column tiles per panel of W kept in cache, in tiles of 16 (a divisor of n / 16).
        Knob("panel", "choice", tuple(d for d in divisors(n // TILE) if d <= 16)),
        # Reduction steps (64 bytes of A each) unrolled.
        Knob("unroll_k", "choice", tuple(d for d in divisors(groups // TILE) if d <= 4)),
        # 0: panels outermost; 1: row tiles outermost.
        Knob("order", "choice", (0, 1)),
        Knob("parallel_depth", "choice", (1, 2)),
        # Reduction steps ahead whose B rows each step prefetches (0: none).
        Knob("prefetch", "choice", PREFETCH_STEPS),
        # Fixed by the task; knobs so the constraint can read them.
        Knob("rows", "choice", (m,)),
    )


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    tm, tn = values["tile_m"], values["tile_n"]
    if (tm, tn) not in SHAPES:
        return f"{tm} x {tn} accumulator tiles with their A and B tiles need more than 8 tile registers"
    if values["rows"] % (tm * TILE):
        return f"{values['rows']} rows are not whole tiles of {tm * TILE}"
    if values["panel"] % tn:
        return "a panel is not a whole number of column tiles"
    return None


def _schedule(dot: _Dot, inst: AmxInstruction, sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    register_amx_intrinsics()
    name, block, store = accumulate_matmul(sch, dot)
    tm, tn = values["tile_m"], values["tile_n"]
    shape = TileShape(tm, tn, prefetch=values["prefetch"])
    *batch, i, j, ko, ki = sch.get_loops(block)
    i_o, i_i = sch.split(i, [None, tm * TILE])
    j_oo, j_o, j_i = sch.split(j, [None, values["panel"] // tn, tn * TILE])
    k_o, k_u, k_i = sch.split(ko, [None, values["unroll_k"], TILE])
    outer = [j_oo, i_o, j_o] if values["order"] == 0 else [i_o, j_oo, j_o]
    sch.reorder(*batch, *outer, k_o, k_u, i_i, j_i, k_i, ki)
    sch.reverse_compute_at(store, outer[-1])
    copy = copy_accumulators(sch, block, store)
    sch.parallel(sch.fuse(*batch, *outer[:values["parallel_depth"]]))
    init = sch.decompose_reduction(block, k_o)
    sch.tensorize(i_i, inst.intrin("update", shape))
    sch.unroll(k_u)
    sch.tensorize(sch.get_loops(init)[-2], inst.intrin("init", shape))
    sch.tensorize(sch.get_loops(copy)[-2], inst.intrin("store", shape))
    epi = sch.get_loops(store)
    j_e_o, j_e_i = sch.split(epi[-1], [None, _VECTOR])
    sch.vectorize(j_e_i)
    sch.unroll(j_e_o)
    logger.debug("scheduled %s with %s", name, values)


def _template(name: str, dot: _Dot, inst: AmxInstruction, description: str) -> Template:
    return register_template(Template(
        name=name,
        knobs=lambda mod, target, limits: _knobs(dot, inst, mod, target, limits),
        schedule=lambda sch, values, limits: _schedule(dot, inst, sch, values, limits),
        constraint=_constraint,
        description=description,
    ))  # fmt: skip


X86_DENSE_AMX_BF16 = _template(
    "x86-dense-amx-bf16", _Dot("matmul_bf16", BF16_DOT), AMX_BF16,
    "bf16 matmul by a packed weight + epilogue, AMX tdpbf16ps tiles (x86 AMX-BF16)",
)
X86_DENSE_AMX_INT8 = _template(
    "x86-dense-amx-int8", _Dot("matmul_u8s8", VNNI_DOT), AMX_INT8,
    "uint8 x int8 matmul by a packed weight + epilogue, AMX tdpbusd tiles (x86 AMX-INT8)",
)
