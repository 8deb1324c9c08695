"""A template as a user's own package would ship it: a tiled, vectorized GEMM for CPUs.

conftest.py registers it with ``register_template`` so the conformance suite covers a
user-registered template too; test_templates.py also loads it through an entry point.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces import Knob, Limits, Template
from search_spaces.knobs import divisors


def _gemm_block(sch: Schedule) -> Any | None:
    blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    if len(blocks) != 1:
        return None
    kinds = [int(iv.iter_type) for iv in sch.get(blocks[0]).iter_vars]
    return blocks[0] if kinds == [0, 0, 2] else None


def _knobs(mod: tvm.IRModule, target: tvm.target.Target, limits: Limits) -> tuple[Knob, ...] | None:
    if str(target.kind.name) != "llvm":
        return None
    sch = Schedule(mod)
    block = _gemm_block(sch)
    if block is None:
        return None
    m, n, _ = (int(sch.get(loop).extent) for loop in sch.get_loops(block))
    return (Knob("tile_m", "choice", tuple(d for d in divisors(m) if d <= 8)),
            Knob("tile_n", "choice", tuple(d for d in divisors(n) if d <= limits.max_vector_lanes)))


def _schedule(sch: Schedule, values: dict[str, Any], limits: Limits) -> None:
    block = _gemm_block(sch)
    i, j, k = sch.get_loops(block)
    i_o, i_i = sch.split(i, [None, values["tile_m"]])
    j_o, j_i = sch.split(j, [None, values["tile_n"]])
    sch.reorder(i_o, j_o, k, i_i, j_i)
    sch.parallel(i_o)
    sch.unroll(i_i)
    sch.vectorize(j_i)
    sch.decompose_reduction(block, k)


USER_GEMM = Template(name="user-gemm", knobs=_knobs, schedule=_schedule,
                     description="test: a user's tiled GEMM")
