"""Static bounds on the GPU thread extents of a sketch, checked before anything is replayed.

A CUDA sketch binds fused, split loops to ``blockIdx``, ``vthread`` and ``threadIdx``; the split factors are
its tile knobs (and, for auto-bound loops, categorical knobs). Following the trace's dataflow
(``SamplePerfectTile``/``SampleCategorical`` -> ``Split`` -> ``Fuse`` -> ``Bind``) gives each
bound loop's extent as a product of knob values, so the limits TVM's ``VerifyGPUCode``
postprocessor enforces after a replay can be checked on the point itself:

- threads per block at most the target's ``max_threads_per_block``;
- the ``thread_extent_low_inclusive``/``high_inclusive`` range that multi-level tiling
  annotates the tiled block with (at least a warp of threads).

Only necessary conditions are derived, so no valid point is ever refused: a factor the
analysis cannot follow counts as 1 (the product is then a lower bound of the extent, and only
upper limits are applied to it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import tvm
from tvm.s_tir.schedule import Instruction

from search_spaces.knobs import Knob

_LOW = "meta_schedule.thread_extent_low_inclusive"
_HIGH = "meta_schedule.thread_extent_high_inclusive"


@dataclass(frozen=True)
class ThreadBound:
    """One bound loop: its extent is ``const`` times the knob values ``terms`` name.

    Attributes:
        axis: the thread axis (``threadIdx.x``...).
        terms: ``(knob, level)`` pairs: level ``k >= 0`` is the k-th factor of a tile knob,
            ``-1`` the candidate a categorical knob's index stands for.
        const: constant factors of the extent.
        complete: every factor is known, so the product is the extent (not a lower bound).
        low: smallest allowed extent (applied only when ``complete``).
        high: largest allowed extent.
    """

    axis: str
    terms: tuple[tuple[int, int], ...]
    const: int
    complete: bool
    low: int
    high: int

    @staticmethod
    def factor(term: tuple[int, int], value: Any, knob: Knob) -> int:
        """What one term contributes for a knob value."""
        level = term[1]
        return int(knob.candidates[int(value)]) if level < 0 else int(value[level])

    def extent(self, decisions: Sequence[Any], knobs: Sequence[Knob]) -> int:
        """The bound loop's extent (a lower bound of it when not ``complete``)."""
        return self.const * math.prod(self.factor(t, decisions[t[0]], knobs[t[0]]) for t in self.terms)

    def violation(self, decisions: Sequence[Any], knobs: Sequence[Knob]) -> str | None:
        """Why these decisions break the bound, or None."""
        n = self.extent(decisions, knobs)
        if n > self.high:
            return f"{self.axis} extent {n} over its limit {self.high}"
        if self.complete and n < self.low:
            return f"{self.axis} extent {n} under TVM's lower bound {self.low} for this tiling"
        return None


def thread_bounds(insts: Sequence[Instruction], knob_at: dict[int, int], max_threads: int) -> tuple[ThreadBound, ...]:
    """The bounds of one sketch's instructions; ``knob_at`` maps an instruction's position to
    the index of the knob it samples."""
    values: list[tuple[Any, tuple[tuple[int, int], ...], int, bool]] = []  # rv, terms, const, complete

    def known(rv: Any) -> tuple[tuple[tuple[int, int], ...], int, bool]:
        if isinstance(rv, tvm.tirx.IntImm | int):
            return (), int(rv), True
        for other, terms, const, complete in values:
            if other.same_as(rv):
                return terms, const, complete
        return (), 1, False

    bounds: list[ThreadBound] = []
    for k, inst in enumerate(insts):
        name = inst.kind.name
        if name == "SamplePerfectTile" and k in knob_at:
            values += [(out, ((knob_at[k], level),), 1, True) for level, out in enumerate(inst.outputs)]
        elif name == "SampleCategorical" and k in knob_at:
            values.append((inst.outputs[0], ((knob_at[k], -1),), 1, True))
        elif name == "Split":
            values += [(out, *known(f)) if f is not None else (out, (), 1, False)
                       for out, f in zip(inst.outputs, inst.inputs[1:], strict=False)]  # fmt: skip
        elif name == "Fuse":
            parts = [known(rv) for rv in inst.inputs]
            values.append((inst.outputs[0], tuple(t for p in parts for t in p[0]),
                           math.prod(p[1] for p in parts), all(p[2] for p in parts)))  # fmt: skip
        elif name == "Bind":
            axis = str(inst.attrs[0])
            # Virtual threads are not bounded here: TVM 0.27's postprocessors accepted 16 and 32.
            if axis.startswith("threadIdx"):
                terms, const, complete = known(inst.inputs[0])
                bounds.append(ThreadBound(axis, terms, const, complete, 1, max_threads))
        elif name == "Annotate" and str(inst.attrs[0]) in (_LOW, _HIGH):
            # Multi-level tiling annotates the block it just bound to threadIdx.
            last = next((i for i in range(len(bounds) - 1, -1, -1) if bounds[i].axis.startswith("threadIdx")), None)
            if last is not None and isinstance(inst.inputs[1], tvm.tirx.IntImm | int):
                value, b = int(inst.inputs[1]), bounds[last]
                is_low = str(inst.attrs[0]) == _LOW
                bounds[last] = replace(b, low=value) if is_low else replace(b, high=min(b.high, value))
    return tuple(b for b in bounds if b.terms)


def count_within(bounds: Sequence[ThreadBound], knobs: Sequence[Knob]) -> int:
    """How many points of the knobs' grid satisfy every bound (exact, by dynamic programming
    over the knobs the bounds involve; the others multiply)."""
    involved = sorted({t[0] for b in bounds for t in b.terms})
    free = math.prod(len(k) for i, k in enumerate(knobs) if i not in involved)
    states: dict[tuple[int, ...], int] = {tuple(b.const for b in bounds): 1}
    for i in involved:
        per_bound = [[t for t in b.terms if t[0] == i] for b in bounds]
        nxt: dict[tuple[int, ...], int] = defaultdict(int)
        for value in knobs[i].choices:
            mult = [math.prod(b.factor(t, value, knobs[i]) for t in terms) for b, terms in zip(bounds, per_bound,
                                                                                                strict=True)]
            for state, n in states.items():
                new = tuple(s * m for s, m in zip(state, mult, strict=True))
                if all(e <= b.high for e, b in zip(new, bounds, strict=True)):  # extents only grow
                    nxt[new] += n
        states = nxt
    ok = sum(n for state, n in states.items()
             if all(not b.complete or e >= b.low for e, b in zip(state, bounds, strict=True)))  # fmt: skip
    return ok * free
