"""The search-space interface every space kind implements, and the machinery they share."""

from __future__ import annotations

import abc
import itertools
import json
import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import Trace

from search_spaces.knobs import Knob

logger = logging.getLogger(__name__)

# How many random draws sample()/mutate() make before giving up on finding a valid point.
MAX_TRIES = 64
# sample() draws more: a space whose constraint refuses most of its grid (x86-conv2d-nchwc-dot
# on AVX-512 since its split knob: 9% of uniform draws valid) must still give a point.
SAMPLE_TRIES = 512
_CACHE_SIZE = 256


class InvalidPointError(ValueError):
    """A point is outside its space: wrong shape, a value outside a knob's domain, a broken
    constraint, or TVM's postprocessors reject its schedule."""


@dataclass(frozen=True)
class Point:
    """One schedule in a space: which sketch, and the value of each of its knobs.

    ``decisions`` holds one JSON-able value per knob of the sketch, in the order of
    ``space.knobs(sketch)`` (a tuple of tile factors, a categorical index, a compute-location
    index, an annotation value...).
    """

    sketch: int
    decisions: tuple[Any, ...]

    def to_json(self) -> str:
        """A canonical JSON string: equal points give equal strings."""
        return json.dumps({"sketch": self.sketch, "decisions": _jsonable(self.decisions)},
                          separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Point:
        """Inverse of :meth:`to_json`."""
        obj = json.loads(text)
        return Point(sketch=int(obj["sketch"]), decisions=_freeze(obj["decisions"]))


class SearchSpace(abc.ABC):
    """The space of schedules of one task (a PrimFunc module) on one target.

    A space is a union of sketches; each sketch is a grid of knobs (``knobs(sketch)``), each
    knob a finite ordered domain. A point is valid when every value is in its knob's domain,
    the space's constraints hold (checked before anything is built: unroll and vector width
    bounds, GPU limits), and the schedule it gives passes TVM's postprocessors.

    Contract: a space is deterministic given its module, target and seed; ``apply`` of the
    same point always gives the same schedule, in any process; points are plain values that
    survive JSON, processes and machines. ``sample``, ``mutate``, ``neighbours`` and
    ``enumerate`` return valid points only. Spaces are not thread-safe (they cache applied
    schedules); give each thread its own.
    """

    #: The name ``search_spaces.create`` knows this kind by.
    kind: ClassVar[str] = ""
    #: Whether the kind counts its own builds in ``built`` (one that builds a point in
    #: several steps, e.g. a sketch replayed before its postprocessors run).
    counts_builds: ClassVar[bool] = False

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target) -> None:
        self.mod = mod
        self.target = target
        self._cache: OrderedDict[str, Schedule | str] = OrderedDict()
        #: Schedules built from the module (a sketch replayed, a template applied), by point
        #: JSON: a point is built once while it stays in the cache, however it was reached
        #: (``sample``, ``apply``, ``check``). Tests read it to catch a second replay.
        self.built: Counter[str] = Counter()

    # --- what a space kind defines -------------------------------------------------------

    @property
    @abc.abstractmethod
    def num_sketches(self) -> int:
        """How many structurally different sketches the space has."""

    @abc.abstractmethod
    def knobs(self, sketch: int) -> tuple[Knob, ...]:
        """The knobs of one sketch, in the order of ``Point.decisions``."""

    @abc.abstractmethod
    def _schedule(self, point: Point) -> Schedule:
        """Build the schedule of a point that passed :meth:`static_violation`.

        Raises:
            InvalidPointError: the point's schedule is invalid (e.g. a postprocessor fails).
        """

    def _constraint_violation(self, point: Point) -> str | None:
        """Why a point inside every knob's domain breaks a constraint of the space, or None."""
        return None

    # --- shared machinery ----------------------------------------------------------------

    def size(self) -> int:
        """Points of the knob grid that satisfy every constraint checkable without building.

        Exact for the grid: every sketch's product of knob domains, minus points that break
        a static constraint. Points that TVM's postprocessors reject, or whose conditional
        knobs (compute location) name a location TVM does not offer for that tiling, are
        only known by applying them; :meth:`enumerate` skips those.
        """
        total = 0
        for s in range(self.num_sketches):
            total += self._static_count(s)
        return total

    def grid_size(self) -> int:
        """Every knob assignment of every sketch, before any constraint."""
        return sum(math.prod(len(k) for k in self.knobs(s)) for s in range(self.num_sketches))

    def _static_count(self, sketch: int) -> int:
        # Kinds with static constraints override this with an exact count.
        return math.prod(len(k) for k in self.knobs(sketch))

    def starts(self) -> list[Point]:
        """Points worth measuring before any search (a template's proven tiles); none by
        default. Every one is inside the space's grid and constraints."""
        return []

    def static_violation(self, point: Point) -> str | None:
        """Why ``point`` is outside the grid or breaks a static constraint, or None."""
        if not 0 <= point.sketch < self.num_sketches:
            return f"sketch {point.sketch} out of range [0, {self.num_sketches})"
        knobs = self.knobs(point.sketch)
        if len(knobs) != len(point.decisions):
            return (f"point has {len(point.decisions)} decisions, sketch {point.sketch} has "
                    f"{len(knobs)} knobs")
        for knob, value in zip(knobs, point.decisions, strict=True):
            try:
                knob.index(value)
            except ValueError as err:
                return str(err)
        return self._constraint_violation(point)

    def check(self, point: Point) -> str | None:
        """Why ``point`` is not a valid point of the space (applying it if needed), or None."""
        got = self._cached(point)
        return got if isinstance(got, str) else None

    def is_valid(self, point: Point) -> bool:
        """Whether ``point`` is a valid point of the space."""
        return self.check(point) is None

    def apply(self, point: Point) -> Schedule:
        """The concrete schedule of ``point``, post-processed and ready to build.

        Raises:
            InvalidPointError: the point is not a valid point of this space.
        """
        got = self._cached(point)
        if isinstance(got, str):
            raise InvalidPointError(got)
        try:
            return got.copy()
        except tvm.error.InternalError:
            # TVM 0.27's Schedule.copy fails on any tensorized schedule (unordered_map::at,
            # with TVM's own dot_16x4_vnni too): schedule the point afresh instead.
            if not self.counts_builds:
                self.built[point.to_json()] += 1
            return self._schedule(point)

    def to_trace(self, point: Point) -> Trace:
        """The TVM trace of ``point`` (postprocessing included): what TVM's database stores
        and what ``Trace.apply_to_schedule`` plus the postprocessors replay."""
        return self.apply(point).trace

    def sample(self, rng: np.random.Generator) -> Point:
        """Draw a random valid point: a sketch uniformly, then each knob uniformly.

        Raises:
            RuntimeError: no valid point was found after many tries.
        """
        for _ in range(SAMPLE_TRIES):
            sketch = int(rng.integers(self.num_sketches))
            values = tuple(k.choices[int(rng.integers(len(k)))] for k in self.knobs(sketch))
            point = Point(sketch, values)
            if self.is_valid(point):
                return point
        raise RuntimeError(f"no valid point after {SAMPLE_TRIES} samples")

    def mutate(self, point: Point, rng: np.random.Generator) -> Point:
        """A valid point that differs from ``point`` in one knob, drawn uniformly from that
        knob's other values.

        Raises:
            RuntimeError: no valid mutation was found after many tries (e.g. a space of one
                point).
        """
        knobs = self.knobs(point.sketch)
        movable = [i for i, k in enumerate(knobs) if len(k) > 1]
        for _ in range(MAX_TRIES if movable else 0):
            i = movable[int(rng.integers(len(movable)))]
            others = [v for v in knobs[i].choices if v != point.decisions[i]]
            new = list(point.decisions)
            new[i] = others[int(rng.integers(len(others)))]
            cand = Point(point.sketch, tuple(new))
            if self.is_valid(cand):
                return cand
        raise RuntimeError(f"no valid mutation of {point.to_json()} after {MAX_TRIES} tries")

    def neighbours(self, point: Point) -> list[Point]:
        """Every valid point one step away in one knob (see :meth:`Knob.neighbours`)."""
        out: list[Point] = []
        for i, knob in enumerate(self.knobs(point.sketch)):
            for value in knob.neighbours(point.decisions[i]):
                new = list(point.decisions)
                new[i] = value
                cand = Point(point.sketch, tuple(new))
                if self.is_valid(cand):
                    out.append(cand)
        return out

    def enumerate(self, *, max_points: int = 100_000) -> Iterator[Point]:
        """Every valid point, sketch by sketch, knobs in lexicographic order.

        Raises:
            ValueError: the grid has more than ``max_points`` points (listing it would apply
                each one).
        """
        if self.grid_size() > max_points:
            raise ValueError(f"space grid has {self.grid_size()} points, more than max_points={max_points}")
        for s in range(self.num_sketches):
            for values in itertools.product(*(k.choices for k in self.knobs(s))):
                point = Point(s, tuple(values))
                if self.is_valid(point):
                    yield point

    def _cached(self, point: Point, make: Callable[[], Schedule] | None = None) -> Schedule | str:
        """The schedule of ``point`` or why it is invalid, from the cache or made once;
        ``make`` makes it where the caller has the point half-built already (``sample``)."""
        key = point.to_json()
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        reason = self.static_violation(point)
        result: Schedule | str
        if reason is not None:
            result = reason
        else:
            if not self.counts_builds:
                self.built[key] += 1
            try:
                result = make() if make is not None else self._schedule(point)
            except InvalidPointError as err:
                result = str(err)
        self._cache[key] = result
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return result


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return int(value)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
