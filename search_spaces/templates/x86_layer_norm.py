"""``x86-layer-norm``: layer norm over the last axis (+ an elementwise epilogue), row by row,
vectorized (:mod:`.rows`).

The task is TOPI's layer norm as Relax legalizes it: the blocks ``<x>_sum`` (the row's
sum), ``<x>_mean``, ``<x>_var_sum`` (the sum of squared deviations from the mean) and
``T_layer_norm``, then the elementwise blocks fused after it (BERT's int8 quantize of the
normalized values). The two sums are the row's reductions, the mean is one value per row,
and the normalization is inlined into the output, which reads the row a third time from L1
(a BERT row is 768 floats, 3 KB).
"""

from __future__ import annotations

import logging
from typing import Any

from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.templates.blocks import elementwise_tail, loop_extents, root_blocks
from search_spaces.templates.rows import per_row, reduces_last_axis, register_row_template, schedule_rows

logger = logging.getLogger(__name__)

NAME = "x86-layer-norm"
_NORM = "T_layer_norm"


def _blocks(sch: Schedule) -> tuple[tuple[str, str, str], list[str]] | None:
    """The sum, mean and variance-sum blocks and the epilogue's blocks, or None when the task
    is not a last-axis layer norm followed by elementwise blocks."""
    names = [sch.get(b).name_hint for b in root_blocks(sch)]
    if names[3:4] != [_NORM]:
        return None
    total, mean, var = names[:3]
    if not (total.endswith("_sum") and mean.endswith("_mean") and var.endswith("_var_sum")):
        return None
    norm = sch.get_sblock(_NORM)
    if not (reduces_last_axis(sch, total, norm) and reduces_last_axis(sch, var, norm) and per_row(sch, mean, norm)):
        return None
    tail = elementwise_tail(sch, norm, len(loop_extents(sch, norm)))
    return None if tail is None else ((total, mean, var), tail)


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    found = _blocks(sch)
    if found is None:
        raise ValueError("not a last-axis layer norm with an elementwise epilogue")
    (total, _, var), tail = found
    schedule_rows(sch, values, inline=[_NORM, *tail[:-1]] if tail else [], reductions=[total, var],
                  out=tail[-1] if tail else _NORM, full_rows=[])
    logger.debug("scheduled layer norm with %s", values)


X86_LAYER_NORM = register_row_template(
    NAME, _blocks, _NORM, _schedule,
    "layer norm over the last axis + elementwise epilogue, a row at a time (x86)",
)
