"""``x86-softmax``: softmax over the last axis (+ an elementwise epilogue), row by row,
vectorized (:mod:`.rows`).

The task is TOPI's softmax as ``tune`` legalizes it (``fast_softmax``,
:func:`tuner.graph.layout.legalize._legalize_softmax`; TVM's own ``exp`` where the input is not float32):
the blocks ``T_softmax_maxelem`` (the row's max), ``T_softmax_delta``, ``T_fast_exp``
(``T_softmax_exp``, which reads the input itself), ``T_softmax_expsum`` (the row's sum),
over the last axis ``T_softmax_rcp`` (the sum's reciprocal, one value per row, computed under
the row loop) and ``T_softmax_norm``, then the elementwise blocks fused after it (BERT's int8
quantize of the probabilities, a cast to bf16 for the next matmul). The max and the sum are
the row's reductions; the exponentials are kept per row (the sum and the outputs both read
them, and each costs a polynomial), vectorized; LLVM keeps BERT's whole row of 128 floats in
eight zmm registers.
"""

from __future__ import annotations

import logging
from typing import Any

from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.templates.blocks import elementwise_tail, loop_extents, root_blocks
from search_spaces.templates.rows import reduces_last_axis, register_row_template, schedule_rows

logger = logging.getLogger(__name__)

NAME = "x86-softmax"
_MAX, _DELTA, _SUM, _NORM = "T_softmax_maxelem", "T_softmax_delta", "T_softmax_expsum", "T_softmax_norm"
_RCP = "T_softmax_rcp"  # the row sum's reciprocal (tuner.graph.layout.ops.fast_softmax_last_axis)
_EXPS = ("T_fast_exp", "T_softmax_exp")


def _blocks(sch: Schedule) -> tuple[str, list[str]] | None:
    """The exponentials' block and the epilogue's blocks, or None when the task is not a
    last-axis softmax followed by elementwise blocks."""
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    exps = [n for n in names if n in _EXPS]
    if len(exps) != 1 or _NORM not in names:
        return None
    head = names[:names.index(_NORM) + 1]
    sums = ([_MAX, _DELTA, exps[0], _SUM], [_MAX, exps[0], _SUM])
    if head not in [first + last for first in sums for last in ([_NORM], [_RCP, _NORM])]:
        return None
    norm = sch.get_sblock(_NORM)
    if not all(reduces_last_axis(sch, name, norm) for name in (_MAX, _SUM)):
        return None
    dims = len(loop_extents(sch, norm))
    tail = elementwise_tail(sch, norm, dims)
    return None if tail is None else (exps[0], tail)


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    found = _blocks(sch)
    if found is None:
        raise ValueError("not a last-axis softmax with an elementwise epilogue")
    exp, tail = found
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    inline = ([_DELTA] if _DELTA in names else []) + ([_NORM, *tail[:-1]] if tail else [])
    schedule_rows(sch, values, inline=inline, reductions=[_MAX, _SUM], out=tail[-1] if tail else _NORM,
                  full_rows=[exp])
    logger.debug("scheduled softmax with %s", values)


X86_SOFTMAX = register_row_template(
    NAME, _blocks, _NORM, _schedule,
    "softmax over the last axis + elementwise epilogue, a row at a time in vector registers (x86)",
)
