"""``x86-softmax``: softmax over the last axis (+ an elementwise epilogue), row by row,
vectorized.

The task is TOPI's softmax as ``tune`` legalizes it (``fast_softmax``,
:func:`tuner.layout._legalize_softmax`; TVM's own ``exp`` where the input is not float32):
the blocks ``T_softmax_maxelem`` (the row's max), ``T_softmax_delta``, ``T_fast_exp``
(``T_softmax_exp``, which reads the input itself), ``T_softmax_expsum`` (the row's sum) and ``T_softmax_norm``, then the
elementwise blocks fused after it (BERT's int8 quantize of the probabilities, a cast to
bf16 for the next matmul).

The schedule computes every row's max, exponentials, sum and outputs inside one loop over
rows, ``rows`` rows per iteration of the parallel loop, so that a row's 128 floats stay in
registers (LLVM keeps BERT's whole row in eight zmm registers) instead of passing through
memory between the five loops nests the sketch space schedules apart. Each reduction is
split into ``lanes`` partial maxima (sums) by ``rfactor``, so that its loop vectorizes,
and the partials are combined per row. The epilogue is inlined into the output block,
whose row loop is vectorized ``lanes`` wide, as is the exponentials'.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob
from search_spaces.templates import Template, register_template
from search_spaces.templates.blocks import elementwise_tail, iter_kinds, loop_extents, root_blocks

logger = logging.getLogger(__name__)

NAME = "x86-softmax"
_MAX, _DELTA, _SUM, _NORM = "T_softmax_maxelem", "T_softmax_delta", "T_softmax_expsum", "T_softmax_norm"
_EXPS = ("T_fast_exp", "T_softmax_exp")
_LANES = (16, 8)
_ROWS = (1, 2, 4, 8)


def _blocks(sch: Schedule) -> tuple[str, list[str]] | None:
    """The exponentials' block and the epilogue's blocks, or None when the task is not a
    last-axis softmax followed by elementwise blocks."""
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    exps = [n for n in names if n in _EXPS]
    if len(exps) != 1 or _NORM not in names:
        return None
    head = names[:names.index(_NORM) + 1]
    if head not in ([_MAX, _DELTA, exps[0], _SUM, _NORM], [_MAX, exps[0], _SUM, _NORM]):
        return None
    norm = sch.get_sblock(_NORM)
    dims = len(loop_extents(sch, norm))
    for name in (_MAX, _SUM):
        block = sch.get_sblock(name)
        if iter_kinds(sch, block) != "S" * (dims - 1) + "R" or loop_extents(sch, block) != loop_extents(sch, norm):
            return None  # not a reduction over the last axis
    tail = elementwise_tail(sch, norm, dims)
    return None if tail is None else (exps[0], tail)


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    if _blocks(sch) is None:
        return None
    *outer, row = loop_extents(sch, sch.get_sblock(_NORM))
    rows = 1
    for extent in outer:
        rows *= extent
    lanes = tuple(v for v in _LANES if row % v == 0)
    if not lanes:
        return None
    return (
        # Rows per iteration of the parallel loop, computed one after another.
        Knob("rows", "choice", tuple(r for r in _ROWS if rows % r == 0)),
        # Vector lanes of the row loops and of the reductions' partial results.
        Knob("lanes", "choice", lanes),
        # 1: a parallel iteration's rows unrolled, so that LLVM may interleave one row's
        # reductions (a serial chain across the lanes) with the next row's work.
        Knob("unroll_rows", "choice", (0, 1)),
    )


def _constraint(values: dict[str, Any], limits: Limits) -> str | None:
    if values["unroll_rows"] and values["rows"] == 1:
        return "a single row per iteration has nothing to unroll"
    return None


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    found = _blocks(sch)
    if found is None:
        raise ValueError("not a last-axis softmax with an elementwise epilogue")
    exp, tail = found
    lanes = values["lanes"]
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    for name in ([_DELTA] if _DELTA in names else []) + ([_NORM, *tail[:-1]] if tail else []):
        sch.compute_inline(sch.get_sblock(name))
    out = sch.get_sblock(tail[-1]) if tail else sch.get_sblock(_NORM)
    partials = []
    for name in (_MAX, _SUM):
        block = sch.get_sblock(name)
        _, lane = sch.split(sch.get_loops(block)[-1], [None, lanes])
        partials.append(sch.rfactor(lane, 0))
    *outer, _ = sch.get_loops(out)
    row_o, row_i = sch.split(sch.fuse(*outer), [None, values["rows"]])
    sch.parallel(row_o)
    # Producers under the row loop, consumers first (each compute_at needs its consumers placed).
    for name in (_SUM, f"{_SUM}_rf", exp, _MAX, f"{_MAX}_rf"):
        sch.compute_at(sch.get_sblock(name), row_i)
    for block in (out, sch.get_sblock(exp)):
        _, vec = sch.split(sch.get_loops(block)[-1], [None, lanes])
        sch.vectorize(vec)
    for rf in partials:
        # rfactor leaves the partials' lane loop outside the reduction's: swap them, so the
        # lanes are innermost and each step is one vector max (add).
        *_, lane, steps = sch.get_loops(rf)
        sch.reorder(steps, lane)
        sch.vectorize(lane)
    if values["unroll_rows"]:
        sch.unroll(row_i)
    logger.debug("scheduled softmax with %s", values)


X86_SOFTMAX = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    constraint=_constraint,
    description="softmax over the last axis + elementwise epilogue, a row at a time in vector registers (x86)",
))  # fmt: skip
