"""``x86-dense-bf16``, ``x86-dense-vnni`` and ``x86-dense-avx2-int8``: matmul by a packed weight
(+ epilogue) on an x86 dot-product instruction.

The task is what :mod:`tuner.precision` makes of a dense layer: a block ``matmul_bf16``
(``matmul_u8s8``) with spatial iters (batch..., m, n) and two reduce iters (ko, ki), ki of
extent 2 (4), reading A[..., m, e ko + ki] (bfloat16; uint8) and W[n // b, ko, n % b, ki]
(bfloat16; int8, packed at compile time in blocks of ``b`` columns,
:func:`tuner.precision.bf16.pack_weight`), accumulating in float32 (int32); then
elementwise epilogue blocks (bias, GELU, residual; for int8 the zero-point correction and
requantize). A bf16 attention matmul is the same block with W[batch..., n // b, ko, n % b,
ki], its second activation packed where it is made; the batch loops join the parallel loop.

The micro-kernel is the one of ``x86-dense`` with the FMA replaced by the dot-product
instruction: for each group of reduction elements, the group of A is broadcast (one 32-bit
lane) and multiplied with 16 column groups of W (one 512-bit load), each of the 16 sums of
a tile's register adding 2 (``vdpbf16ps``, tensor intrinsic ``dot_16x2_bf16_avx512_local``)
or 4 (``vpdpbusd``, ``dot_16x4_vnni_local``) products; on AVX2, 8 column groups (one 256-bit
load) and ``vpmaddubsw`` + ``vpmaddwd`` (``dot_8x4_avx2_local``), whose int16 pair sums are
exact for the 7-bit weights :mod:`tuner.precision.qdq` packs for it (``pair_limit``). The
register tile is ``tile_m`` rows
x ``tile_n`` columns. As in ``x86-dense``, ``tile_m`` need not divide the rows: oneDNN's
AVX-512 kernels are 6 rows x 4 vectors (24 accumulators), and BERT's 128 tokens are 21 tiles
of 6 and one of 2, peeled (:mod:`search_spaces.lowering`) from a serial row-tile loop (on a
Zen 4 BERT-base's best partial tiles, 10 rows x 2 vectors or 5 x 4, took 0.91-0.98x the time
of the best dividing ones per layer, but the model did not measurably change).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
from search_spaces.x86.intrin import (
    AVX2_DOT,
    BF16_DOT,
    VNNI_DOT,
    DotInstruction,
    register_intrinsics,
    target_has,
)

logger = logging.getLogger(__name__)

# As in x86-dense: accumulators may take 24 of the 32 zmm registers (AVX2's instruction 12 of
# its 16 ymm: one holds the broadcast, one the int16 products, two a weight vector and
# vpmaddwd's ones); fewer than 4 leave the dot-product units waiting on the previous result.
_ACC_REGISTERS = 24
_AVX2_ACC_REGISTERS = 12
_MIN_ACC_REGISTERS = 4
_MAX_UNROLLED_DOTS = 512


@dataclass(frozen=True)
class _Dot:
    """A dot-product instruction and the name prefix of the matmul block it serves."""

    prefix: str
    instruction: DotInstruction


def _matmul_block(sch: Schedule, dot: _Dot) -> Any | None:
    blocks = root_blocks(sch)
    found = [b for b in blocks if sch.get(b).name_hint.startswith(dot.prefix)]
    if len(found) != 1 or elementwise_prologue(sch, found[0]) is None:
        return None
    kinds = iter_kinds(sch, found[0])
    if len(kinds) < 4 or kinds != "S" * (len(kinds) - 2) + "RR":
        return None
    stmt = sch.get(found[0])
    if int(stmt.iter_vars[-1].dom.extent) != dot.instruction.elements or len(stmt.reads) != 2:
        return None
    if tuple(str(r.source.dtype) for r in stmt.reads) != dot.instruction.dtypes:
        return None
    return found[0]


def weight_block(sch: Schedule, block: Any) -> int:
    """Columns per block of the packed weight the matmul ``block`` reads (``W[..., N/b, K/e, b, e]``)."""
    return int(sch.get(block).reads[1].source.shape[-2])


def _tail(sch: Schedule, block: Any) -> list[str] | None:
    return elementwise_tail(sch, block, len(sch.get_loops(block)) - 2)


def _acc_registers(lanes: int) -> int:
    return _ACC_REGISTERS if lanes == 16 else _AVX2_ACC_REGISTERS


def _knobs(dot: _Dot, mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if not target_has(target, dot.instruction.feature):
        return None
    if dot.instruction.lanes != _lanes(limits):
        return None  # AVX2's 8 lanes where AVX-512 has VNNI or does not: not this template's
    sch = Schedule(mod)
    block = _matmul_block(sch, dot)
    if block is None or _tail(sch, block) is None:
        return None
    *_, m, n, half, _ = (int(sch.get(loop).extent) for loop in sch.get_loops(block))
    lanes = dot.instruction.lanes
    if n % lanes or weight_block(sch, block) % lanes:
        return None
    return (
        Knob("tile_m", "choice", tuple(range(1, min(m, _acc_registers(lanes)) + 1))),
        Knob("tile_n", "choice", tuple(lanes * r for r in (1, 2, 3, 4) if n % (lanes * r) == 0)),
        # Column tiles per panel of W kept in cache, in vectors (a divisor of n / lanes).
        Knob("panel", "choice", tuple(d for d in divisors(n // lanes) if d <= 16)),
        # Groups of the reduction (pairs, quadruples) unrolled per step.
        Knob("unroll_k", "choice", tuple(d for d in divisors(half) if d <= 8)),
        # 0: panels outermost; 1: row tiles outermost.
        Knob("order", "choice", (0, 1)),
        Knob("parallel_depth", "choice", (1, 2)),
        # Fixed by the task; a knob so the constraint can read it.
        Knob("rows", "choice", (m,)),
    )


def _lanes(limits: Limits) -> int:
    """Lanes of the instruction a space of ``limits`` is on: AVX-512's 16, or AVX2's 8 (the
    one instruction of these templates a target without AVX-512 has)."""
    return limits.vector_bits // 32


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    lanes = _lanes(limits)
    regs = values["tile_m"] * values["tile_n"] // lanes
    budget = _acc_registers(lanes)
    if regs > budget:
        return f"register tile needs {regs} vector registers, more than {budget}"
    if regs < _MIN_ACC_REGISTERS:
        return f"register tile of {regs} vector registers, fewer than {_MIN_ACC_REGISTERS}"
    if (values["panel"] * lanes) % values["tile_n"]:
        return "a panel is not a whole number of column tiles"
    if values["rows"] % values["tile_m"] and (values["order"], values["parallel_depth"]) != (0, 1):
        return "a partial last row tile needs the row-tile loop serial (order 0, parallel_depth 1) to be peeled"
    if regs * values["unroll_k"] > _MAX_UNROLLED_DOTS:
        return f"unrolled body of {regs * values['unroll_k']} dot products, more than {_MAX_UNROLLED_DOTS}"
    return None


def _schedule(dot: _Dot, sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    register_intrinsics()
    name, block, store = accumulate_matmul(sch, dot)
    *batch, i, j, ko, ki = sch.get_loops(block)
    tile_n, lanes = values["tile_n"], dot.instruction.lanes
    panel_tiles = values["panel"] * lanes // tile_n
    i_o, i_i = sch.split(i, [None, values["tile_m"]])
    j_oo, j_o, j_v, j_i = sch.split(j, [None, panel_tiles, tile_n // lanes, lanes])
    k_o, k_i = sch.split(ko, [None, values["unroll_k"]])
    outer = [j_oo, i_o, j_o] if values["order"] == 0 else [i_o, j_oo, j_o]
    sch.reorder(*batch, *outer, k_o, k_i, i_i, j_v, j_i, ki)
    sch.reverse_compute_at(store, outer[-1])
    sch.parallel(sch.fuse(*batch, *outer[:values["parallel_depth"]]))
    init = sch.decompose_reduction(block, k_o)
    if values["rows"] % values["tile_m"]:
        sch.annotate(i_o, HINT, 1)  # the shorter last row tile is peeled (see the module's docstring)
        # Tensorize matches the block's predicate too, and the partial tile's bounds check
        # is one: blockize moves it to an outer block, the instruction goes inside.
        sch.blockize(j_i)
        sch.tensorize(sch.get_loops(block)[-2], dot.instruction.intrin)
    else:
        sch.tensorize(j_i, dot.instruction.intrin)
    sch.unroll(k_i)
    sch.unroll(i_i)
    sch.unroll(j_v)
    epi = sch.get_loops(store)
    j_e_o, j_e_i = sch.split(epi[-1], [None, lanes])
    sch.vectorize(j_e_i)
    sch.unroll(j_e_o)
    init_loops = sch.get_loops(init)
    sch.unroll(init_loops[-2])
    sch.vectorize(init_loops[-1])
    logger.debug("scheduled %s with %s", name, values)


def accumulate_matmul(sch: Schedule, dot: _Dot) -> tuple[str, Any, Any]:
    """The matmul block of ``dot``'s task with its elementwise prologue and its epilogue but
    the last block inlined and a local accumulator (:func:`accumulate_locally`): its name,
    the block, and the block that stores the output."""
    block = _matmul_block(sch, dot)
    if block is None:
        raise ValueError(f"no {dot.prefix} block")
    tail = _tail(sch, block)
    if tail is None:
        raise ValueError("an epilogue block is not elementwise over the matmul's output")
    name = sch.get(block).name_hint
    for t in [*(elementwise_prologue(sch, block) or []), *tail[:-1]]:
        sch.compute_inline(sch.get_sblock(t))
    return (name, *accumulate_locally(sch, name, tail))


# oneDNN's AVX-512 brgemm register tiles: 24 accumulators as 6 rows x 4 vectors, or the same
# registers as 12 x 2 and 24 x 1. Three BERT-base bf16 jobs on a Zen 5 without these starts
# settled on 6 x 4, 12 x 2 and 23 x 1 for the GELU layer, 768-848 us (benchmarks/README.md).
_START_TILES = ((6, 4), (12, 2), (24, 1))


# AVX2's, 12 accumulators: 6 rows x 2 vectors, 3 x 4 and 12 x 1.
_AVX2_START_TILES = ((6, 2), (3, 4), (12, 1))


def _starts(lanes: int, choices: dict[str, tuple]) -> list[dict[str, Any]]:
    """The start points: each of oneDNN's tiles (12-accumulator ones on AVX2) with a narrow (up to 4
    vectors) and the widest panel, serial row tiles (so a partial last row tile is allowed),
    two reduction groups unrolled. Tiles the task's columns do not take are dropped by the space."""
    panels = sorted({max(p for p in choices["panel"] if p <= 4), max(choices["panel"])})
    tiles = _START_TILES if lanes == 16 else _AVX2_START_TILES
    return [{"tile_m": m, "tile_n": v * lanes, "panel": panel, "unroll_k": 2 if 2 in choices["unroll_k"] else 1,
             "order": 0, "parallel_depth": 1}
            for m, v in tiles for panel in panels]  # fmt: skip


def _template(name: str, dot: _Dot, description: str) -> Template:
    return register_template(Template(
        name=name,
        knobs=lambda mod, target, limits: _knobs(dot, mod, target, limits),
        schedule=lambda sch, values, limits: _schedule(dot, sch, values, limits),
        constraint=_constraint,
        description=description,
        starts=lambda choices, limits: _starts(dot.instruction.lanes, choices),
    ))  # fmt: skip


X86_DENSE_BF16 = _template(
    "x86-dense-bf16", _Dot("matmul_bf16", BF16_DOT),
    "bf16 matmul by a packed weight + epilogue, vdpbf16ps register tile (x86 AVX512_BF16)",
)
X86_DENSE_VNNI = _template(
    "x86-dense-vnni", _Dot("matmul_u8s8", VNNI_DOT),
    "uint8 x int8 matmul by a packed weight + epilogue, vpdpbusd register tile (x86 AVX512_VNNI)",
)
X86_DENSE_AVX2_INT8 = _template(
    "x86-dense-avx2-int8", _Dot("matmul_u8s8", AVX2_DOT),
    "uint8 x int8 matmul by a packed weight (7-bit) + epilogue, vpmaddubsw + vpmaddwd register tile (x86 AVX2)",
)
