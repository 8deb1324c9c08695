"""``x86-dense``: (batched) matmul C = A @ B (+ fused elementwise epilogue) for x86 CPUs.

The register-blocked GEMM micro-kernel: each step of the reduction broadcasts ``tile_m``
elements of A and loads ``tile_n`` contiguous elements of one row of B (``tile_n`` a
multiple of the vector lanes), and accumulates the ``tile_m x tile_n`` tile of C in vector
registers for the whole of K. Columns are grouped in panels of ``panel`` tiles so that a
panel of B (K x panel * tile_n) stays in cache while every row tile of A streams past it.
The epilogue (bias, gelu, residual add...) is applied to the tile in registers. ``tile_m``
need not divide the rows: MLAS's AVX2 kernel is 6 rows x 16 columns, and BERT's 128 tokens
are 21 tiles of 6 and one of 2. A partial last row tile keeps the row-tile loop serial
(panels outermost, ``parallel_depth`` 1) and carries ``pragma_loop_partition_hint``, so
that it is peeled (:mod:`search_spaces.lowering`). On BERT-base's dense shapes the best
partial tile (6 x 16 on three of four) took 0.90-1.01x the time of the best divisor tile
(AVX2, 2026-11-25; benchmarks/README.md, "Dense row tiles that do not divide the rows").

The task is what Relax legalizes ``matmul`` to (attention's batched products): a block
``matmul*`` with spatial iters (batch..., m, n) and one reduce iter k, reading A[..., m, k]
and B[..., k, n] (B's rows contiguous along n), then elementwise epilogue blocks over C. A
dense layer's constant weight comes packed (``tuner.graph.layout.ops.matmul_packed``: B[n // nb, k,
n % nb]); a panel is then one packed block, contiguous, and nothing is copied at run time.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob, divisors
from search_spaces.lowering import HINT
from search_spaces.templates.blocks import accumulate_locally, elementwise_tail, iter_kinds, root_blocks
from search_spaces.templates.registry import Template, register_template

logger = logging.getLogger(__name__)

NAME = "x86-dense"
_PREFIX = "matmul"
# Vector registers the accumulators may take on AVX-512 (of 32 zmm; AVX2's 16 ymm leave
# fewer, see _acc_budget); the rest hold the B row and the broadcasts.
_ACC_REGISTERS = 24
# Fewest accumulators: an FMA's result is ready ~4 cycles later and two issue per cycle, so
# fewer independent accumulators leave the FMA units idle.
_MIN_ACC_REGISTERS = 4
# Largest unrolled reduction body, in vector FMAs: more only lengthens LLVM's build.
_MAX_UNROLLED_FMAS = 512


def _last_index_var(region: Any) -> Any:
    """The variable of the last (innermost) index of a read region, or None. A packed B
    (:func:`tuner.graph.layout.ops.matmul_packed`: ``B[n // nb, k, n % nb]``) counts as indexed by n."""
    last = region.region[-1].min
    if isinstance(last, tvm.tirx.FloorMod) and isinstance(last.b, tvm.tirx.IntImm):
        last = last.a
    return last if isinstance(last, tvm.tirx.Var) else None


def _packed_block(sch: Schedule, block: Any) -> int | None:
    """Columns per block of a packed B (``B[n // nb, k, n % nb]``), or None for a plain one."""
    stmt = sch.get(block)
    last = stmt.reads[_b_read_index(sch, block)].region[-1].min
    return int(last.b) if isinstance(last, tvm.tirx.FloorMod) else None


def _matmul_block(sch: Schedule) -> Any | None:
    """The one NN matmul block: iters (S..., m, n, k), reading A[..., m, k] and B[..., k, n]."""
    blocks = root_blocks(sch)
    found = [b for b in blocks if sch.get(b).name_hint.startswith(_PREFIX)]
    if len(found) != 1 or sch.get(blocks[0]).name_hint != sch.get(found[0]).name_hint:
        return None
    kinds = iter_kinds(sch, found[0])
    if len(kinds) < 3 or kinds != "S" * (len(kinds) - 1) + "R":
        return None
    block = sch.get(found[0])
    if len(block.reads) != 2:
        return None
    _, n, k = (iv.var for iv in block.iter_vars[-3:])
    # A's rows run along k and B's along n: vectors of C's columns are loads of B's rows.
    # (An NT matmul, B[n, k], would need B packed first; it is left to the sketches.)
    inner = sorted((_last_index_var(r) for r in block.reads), key=lambda v: v is not None and v.same_as(n))
    if not (inner[0] is not None and inner[0].same_as(k) and inner[1] is not None and inner[1].same_as(n)):
        return None
    return found[0]


def _b_read_index(sch: Schedule, block: Any) -> int:
    """Which read of the matmul block is B (the one whose innermost index is n)."""
    stmt = sch.get(block)
    n = stmt.iter_vars[-2].var
    return next(i for i, r in enumerate(stmt.reads) if (v := _last_index_var(r)) is not None and v.same_as(n))


def _tail(sch: Schedule, block: Any) -> list[str] | None:
    """Names of the epilogue blocks, or None when one is not elementwise over C."""
    return elementwise_tail(sch, block, len(sch.get_loops(block)) - 1)


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    block = _matmul_block(sch)
    if block is None or _tail(sch, block) is None:
        return None
    *_, m, n, k = (int(sch.get(loop).extent) for loop in sch.get_loops(block))
    lanes = limits.vector_bits // 32
    if n % lanes:
        return None
    tile_n = tuple(lanes * r for r in (1, 2, 3, 4) if n % (lanes * r) == 0)
    packed = _packed_block(sch, block)
    if packed is not None:
        # A panel is one block of the packed B: contiguous K x nb, nothing left to copy.
        if packed % lanes:
            return None
        tile_n = tuple(t for t in tile_n if packed % t == 0)
        panels: tuple[int, ...] = (packed // lanes,)
    else:
        panels = tuple(d for d in divisors(n // lanes) if d <= 16)
    return (
        # Rows of the register tile; one that does not divide m leaves a shorter last tile.
        Knob("tile_m", "choice", tuple(range(1, min(m, _ACC_REGISTERS) + 1))),
        Knob("tile_n", "choice", tile_n),
        # Column tiles per panel of B kept in cache (a divisor of the tiles in a row).
        Knob("panel", "choice", panels),
        Knob("unroll_k", "choice", tuple(d for d in divisors(k) if d <= 8)),
        # 0: panels outermost (a panel of B is reused by every row tile);
        # 1: row tiles outermost (a row tile of A is reused by every panel).
        Knob("order", "choice", (0, 1)),
        # Outer loops fused into the parallel loop (batch loops always are): 1 or 2.
        Knob("parallel_depth", "choice", (1, 2)),
        # 1: copy each panel of B into a compact buffer before its row tiles read it.
        # Rows of B a multiple of 4 KiB apart (N = 3072) fall into the same cache sets;
        # the copy's rows are a panel apart, so the panel stays in cache.
        Knob("pack_b", "choice", (0,) if packed else (0, 1)),
        # Fixed by the target; a knob so the register constraint can read it.
        Knob("lanes", "choice", (lanes,)),
        # Fixed by the task; a knob so the constraint can read it.
        Knob("rows", "choice", (m,)),
    )


def _acc_budget(values: dict[str, Any], limits: Limits) -> int:
    """Accumulator registers beside the row of B (tile_n / lanes vectors) and a broadcast:
    at most 24 of AVX-512's 32, and what that leaves of AVX2's 16 (the classic 6x16 AVX2
    kernel: 12 + 2 + 1); more would spill to the stack."""
    return min(_ACC_REGISTERS, limits.vector_registers - values["tile_n"] // values["lanes"] - 1)


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    regs = values["tile_m"] * values["tile_n"] // values["lanes"]
    budget = _acc_budget(values, limits)
    if regs > budget:
        return f"register tile needs {regs} vector registers, more than {budget}"
    if regs < _MIN_ACC_REGISTERS:
        return f"register tile of {regs} vector registers, fewer than {_MIN_ACC_REGISTERS}"
    if (values["panel"] * values["lanes"]) % values["tile_n"]:
        return "a panel is not a whole number of column tiles"
    if values["rows"] % values["tile_m"] and (values["order"], values["parallel_depth"]) != (0, 1):
        return "a partial last row tile needs the row-tile loop serial (order 0, parallel_depth 1) to be peeled"
    if values["pack_b"] and (values["order"], values["parallel_depth"]) != (0, 1):
        return "pack_b packs once per panel: needs panels outermost (order 0) and parallel_depth 1"
    if regs * values["unroll_k"] > _MAX_UNROLLED_FMAS:
        return f"unrolled body of {regs * values['unroll_k']} vector FMAs, more than {_MAX_UNROLLED_FMAS}"
    return None


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    block = _matmul_block(sch)
    if block is None:
        raise ValueError("no matmul block")
    tail = _tail(sch, block)
    if tail is None:
        raise ValueError("an epilogue block is not elementwise over the matmul's output")
    name = sch.get(block).name_hint
    b_index = _b_read_index(sch, block)
    for t in tail[:-1]:
        sch.compute_inline(sch.get_sblock(t))
    block, store = accumulate_locally(sch, name, tail)
    *batch, i, j, k = sch.get_loops(block)
    tile_n = values["tile_n"]
    # panel is counted in vectors; in tiles it is panel * lanes / tile_n.
    panel_tiles = values["panel"] * values["lanes"] // tile_n
    lanes = values["lanes"]
    i_o, i_i = sch.split(i, [None, values["tile_m"]])
    # One vector register per j_v: LLVM legalizes wider (and non-power-of-two) vectors
    # with shuffles.
    j_oo, j_o, j_v, j_i = sch.split(j, [None, panel_tiles, tile_n // lanes, lanes])
    k_o, k_i = sch.split(k, [None, values["unroll_k"]])
    outer = [j_oo, i_o, j_o] if values["order"] == 0 else [i_o, j_oo, j_o]
    sch.reorder(*batch, *outer, k_o, k_i, i_i, j_v, j_i)
    sch.reverse_compute_at(store, outer[-1])
    if values["pack_b"]:
        pack = sch.cache_read(block, b_index, "global")
        sch.compute_at(pack, outer[0])
        # TVM compacts the copy to the panel (K x panel columns), rows one panel apart.
        # (No transform_layout to tile-major: an IndexMap in the trace does not survive
        # MetaSchedule's TuningRecord JSON.)
        sch.vectorize(sch.split(sch.get_loops(pack)[-1], [None, lanes])[1])
    sch.parallel(sch.fuse(*batch, *outer[:values["parallel_depth"]]))
    if values["rows"] % values["tile_m"]:
        sch.annotate(i_o, HINT, 1)  # the shorter last row tile is peeled (see the module's docstring)
    sch.unroll(k_i)
    sch.unroll(i_i)
    sch.unroll(j_v)
    sch.vectorize(j_i)
    epi = sch.get_loops(store)
    j_e_o, j_e_i = sch.split(epi[-1], [None, lanes])
    sch.vectorize(j_e_i)
    sch.unroll(j_e_o)
    init = sch.decompose_reduction(block, k_o)
    init_loops = sch.get_loops(init)
    sch.unroll(init_loops[-2])
    sch.vectorize(init_loops[-1])
    logger.debug("scheduled %s with %s", name, values)


X86_DENSE = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="(batched) matmul + epilogue, register tile of rows x vectors of columns (x86)",
))
