"""A space over a hand-written template's knobs."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import tvm
from tvm.s_tir import Schedule

from search_spaces.base import InvalidPointError, Point, SearchSpace
from search_spaces.constraints import Limits, limits_for
from search_spaces.knobs import Knob
from search_spaces.templates import Template, get_template

logger = logging.getLogger(__name__)

# What a template's schedule function raises on a point it cannot schedule.
_SCHEDULE_ERRORS = (RuntimeError, ValueError)


class TemplateSpace(SearchSpace):
    """The points of one registered template on one task: a single sketch whose knobs the
    template declares, with the template's constraint checked before anything is built."""

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target, template: Template | str, *,
                 limits: Limits | None = None) -> None:
        super().__init__(mod, target)
        self.template = get_template(template) if isinstance(template, str) else template
        self.kind = self.template.name  # type: ignore[misc]
        self.limits = limits or limits_for(target)
        knobs = self.template.knobs(mod, target, self.limits)
        if knobs is None:
            raise ValueError(f"template {self.template.name!r} does not apply to this task on {target.kind.name}")
        self._knobs = tuple(knobs)
        self._count: int | None = None

    @property
    def num_sketches(self) -> int:
        return 1

    def knobs(self, sketch: int) -> tuple[Knob, ...]:
        if sketch != 0:
            raise IndexError(f"template spaces have one sketch, not {sketch + 1}")
        return self._knobs

    def values(self, point: Point) -> dict[str, Any]:
        """The point's knob values by name."""
        return {k.name: v for k, v in zip(self._knobs, point.decisions, strict=True)}

    def starts(self) -> list[Point]:
        """The template's start points (:attr:`Template.starts`) that are in this space, in
        its order, without repeats; a knob a start leaves out takes its first choice."""
        if self.template.starts is None:
            return []
        out: list[Point] = []
        for values in self.template.starts({k.name: k.choices for k in self._knobs}, self.limits):
            point = Point(0, tuple(values.get(k.name, k.choices[0]) for k in self._knobs))
            if point not in out and self.static_violation(point) is None:
                out.append(point)
        return out

    def _constraint_violation(self, point: Point) -> str | None:
        if self.template.constraint is None:
            return None
        return self.template.constraint(self.values(point), self.limits)

    def _static_count(self, sketch: int) -> int:
        if self._count is None:
            self._count = sum(
                1 for values in itertools.product(*(k.choices for k in self._knobs))
                if self._constraint_violation(Point(0, tuple(values))) is None
            )
        return self._count

    def _schedule(self, point: Point) -> Schedule:
        sch = Schedule(self.mod, seed=1)
        try:
            self.template.schedule(sch, self.values(point), self.limits)
        except _SCHEDULE_ERRORS as err:
            raise InvalidPointError(f"template {self.template.name} failed: {_last_line(err)}") from None
        return sch


def _last_line(err: Exception) -> str:
    # TVM's errors carry the whole TIR in front of the one line that says what failed.
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
