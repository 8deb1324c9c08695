"""Row-wise schedules of operators that reduce over the last axis (softmax, layer norm),
shared by ``x86-softmax`` and ``x86-layer-norm``.

Each row's reductions, the values between them and its outputs are computed inside one
loop over rows, ``rows`` rows per iteration of the parallel loop, so that a row stays in
registers or L1 instead of passing through memory between the loop nests that the sketch
space schedules apart. Each reduction is split into ``lanes`` partial results by
``rfactor``, so that its loop vectorizes, and the partials are combined per row. The
output's row loop is vectorized ``lanes`` wide, as is every full-row block kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.constraints import Limits
from search_spaces.knobs import Knob
from search_spaces.templates.blocks import iter_kinds, loop_extents, root_blocks
from search_spaces.templates.registry import Template, register_template

LANES = (16, 8)
ROWS = (1, 2, 4, 8)


def reduces_last_axis(sch: Schedule, name: str, out: Any) -> bool:
    """Whether block ``name`` reduces over the last axis of ``out``'s loops, row by row."""
    block = sch.get_sblock(name)
    dims = len(loop_extents(sch, out))
    return iter_kinds(sch, block) == "S" * (dims - 1) + "R" and loop_extents(sch, block) == loop_extents(sch, out)


def per_row(sch: Schedule, name: str, out: Any) -> bool:
    """Whether block ``name`` computes one value per row of ``out`` (a mean, a variance)."""
    block = sch.get_sblock(name)
    outer = loop_extents(sch, out)[:-1]
    return iter_kinds(sch, block) == "S" * len(outer) and loop_extents(sch, block) == outer


def row_knobs(sch: Schedule, out: Any) -> tuple[Knob, ...] | None:
    """The knobs of a row-wise schedule of the block ``out`` (None: no lane width divides
    its rows' length)."""
    *outer, length = loop_extents(sch, out)
    rows = 1
    for extent in outer:
        rows *= extent
    lanes = tuple(v for v in LANES if length % v == 0)
    if not lanes:
        return None
    return (
        # Rows per iteration of the parallel loop, computed one after another.
        Knob("rows", "choice", tuple(r for r in ROWS if rows % r == 0)),
        # Vector lanes of the row loops and of the reductions' partial results.
        Knob("lanes", "choice", lanes),
        # 1: a parallel iteration's rows unrolled, so that LLVM may interleave one row's
        # reductions (a serial chain across the lanes) with the next row's work.
        Knob("unroll_rows", "choice", (0, 1)),
    )


def row_constraint(values: dict[str, Any], limits: Any) -> str | None:
    """Points a row-wise schedule rejects."""
    if values["unroll_rows"] and values["rows"] == 1:
        return "a single row per iteration has nothing to unroll"
    return None


def schedule_rows(sch: Schedule, values: dict[str, Any], *, inline: list[str], reductions: list[str],
                  out: str, full_rows: list[str]) -> None:
    """Schedule row by row: ``inline`` inlined, each of ``reductions`` split into lane
    partials, every remaining block computed under the output ``out``'s row loop, and
    ``out`` and the kept full-row blocks ``full_rows`` vectorized."""
    lanes = values["lanes"]
    for name in inline:
        sch.compute_inline(sch.get_sblock(name))
    partials = []
    for name in reductions:
        block = sch.get_sblock(name)
        _, lane = sch.split(sch.get_loops(block)[-1], [None, lanes])
        partials.append(sch.rfactor(lane, 0))
    block = sch.get_sblock(out)
    *outer, _ = sch.get_loops(block)
    row_o, row_i = sch.split(sch.fuse(*outer), [None, values["rows"]])
    sch.parallel(row_o)
    # Producers under the row loop, consumers first (each compute_at needs its consumers placed).
    for name in reversed([sch.get(b).name_hint for b in root_blocks(sch)]):
        if name != out:
            sch.compute_at(sch.get_sblock(name), row_i)
    for b in (block, *(sch.get_sblock(n) for n in full_rows)):
        _, vec = sch.split(sch.get_loops(b)[-1], [None, lanes])
        sch.vectorize(vec)
    for rf in partials:
        # rfactor leaves the partials' lane loop outside the reduction's: swap them, so the
        # lanes are innermost and each step is one vector operation.
        *_, lane, steps = sch.get_loops(rf)
        sch.reorder(steps, lane)
        sch.vectorize(lane)
    if values["unroll_rows"]:
        sch.unroll(row_i)


def register_row_template(name: str, matches: Callable[[Schedule], Any], anchor: str,
                          schedule: Callable[[Schedule, dict[str, Any], Limits], None], description: str) -> Template:
    """Register a row-wise template: it applies to LLVM targets where ``matches(sch)`` is not
    None, with the knobs of :func:`row_knobs` over the block ``anchor``'s rows."""

    def knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
        if str(target.kind.name) != "llvm":
            return None
        sch = Schedule(mod)
        if matches(sch) is None:
            return None
        return row_knobs(sch, sch.get_sblock(anchor))

    return register_template(Template(name=name, knobs=knobs, schedule=schedule, constraint=row_constraint,
                                      description=description))  # fmt: skip
