"""``x86-row-taps``: the copy of an image into the rows of kernel taps an AMX stem reads
(:func:`tuner.graph.layout.ops.row_taps`), with the input's cast, channel pad and layout transform
inlined, vectorized over each channel's taps.

The task is a few elementwise blocks (ResNet-50 bf16: the float32 image's cast, its fourth,
zero channel and its layout transform) and then the block ``row_taps``, whose element (ih,
ow, c t' + t) is the image at row ih, column ``ow * stride + t``, channel c, zero in the
padding. Every element is bounds-checked, so the sketch space's vectorized candidates
evaluate the check lane by lane: on an Emerald Rapids ResNet-50's was the slowest function
outside the convs, 0.84 ms against 0.40 for the stem conv it feeds, and a scalar loop took
0.21. Here the column loop is partitioned (``loop_partition``) into the columns whose every
slot lies inside the image (the block's annotation :data:`tuner.graph.layout.plan.ROW_TAPS_ATTR`) and
the edges; inside, the check holds for every lane, TVM's simplifier removes it and a
channel's ``t'`` slots are one vector: ``t'`` neighbouring image columns, cast and stored
(0.10 ms on that Emerald Rapids). The edges stay scalar, unrolled over the slots.
"""

from __future__ import annotations

import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob
from search_spaces.templates.blocks import iter_kinds, loop_extents, root_blocks
from search_spaces.templates.registry import Template, register_template

logger = logging.getLogger(__name__)

NAME = "x86-row-taps"
_BLOCK = "row_taps"
_ATTR = "nightshift.row_taps"  # tuner.graph.layout.plan.ROW_TAPS_ATTR (search_spaces does not import tuner)


def _row_taps(sch: Schedule) -> tuple[Any, tuple[int, int, int]] | None:
    """The annotated ``row_taps`` block, last of the task, and its annotation (first and
    last interior column, slots a channel), or None when the task is something else or a
    block before it is not spatial (it could not be inlined)."""
    blocks = root_blocks(sch)
    if not blocks or sch.get(blocks[-1]).name_hint != _BLOCK:
        return None
    block = blocks[-1]
    attr = sch.get(block).annotations.get(_ATTR)
    if attr is None or len(attr) != 3 or any("R" in iter_kinds(sch, b) for b in blocks):
        return None
    first, last, slots = (int(a) for a in attr)
    if len(loop_extents(sch, block)) != 5:
        return None
    return block, (first, last, slots)


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    found = _row_taps(sch)
    if found is None:
        return None
    block, (first, last, slots) = found
    extents = loop_extents(sch, block)
    vectors = last > first and extents[-1] % slots == 0
    return (
        # 1: the interior columns' slots of a channel are one vector; 0: scalar, unrolled.
        Knob("vector", "choice", (1, 0) if vectors else (0,)),
        # Rows per iteration of the parallel loop.
        Knob("rows", "choice", tuple(r for r in (1, 2, 4) if extents[2] % r == 0)),
    )


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    found = _row_taps(sch)
    if found is None:
        raise ValueError("no annotated row_taps block after spatial blocks")
    block, (first, last, slots) = found
    for b in root_blocks(sch)[:-1]:
        sch.compute_inline(b)
    n, chunk, row, col, slot = sch.get_loops(block)
    row_o, _ = sch.split(row, [None, values["rows"]])
    sch.parallel(sch.fuse(n, chunk, row_o))
    width = loop_extents(sch, block)[3]
    parts = [size for size in (first, last - first, width - last) if size]
    interior = first > 0
    loops = sch.loop_partition(col, [*parts[:-1], None]) if len(parts) > 1 else [col]
    for index, loop in enumerate(loops):
        [inner] = sch.get_child_blocks(loop)
        slot = sch.get_loops(inner)[-1]
        if values["vector"] and index == int(interior):
            channel, taps = sch.split(slot, [None, slots])
            sch.vectorize(taps)
            sch.unroll(channel)
        else:
            sch.unroll(slot)
    logger.debug("scheduled row_taps with %s", values)


X86_ROW_TAPS = register_template(Template(
    name=NAME,
    knobs=_knobs,
    schedule=_schedule,
    description="an image copied into rows of kernel taps (AMX stem), interior columns vectorized (x86)",
    starts=lambda choices, limits: [{"vector": choices["vector"][0], "rows": 1}],
))
