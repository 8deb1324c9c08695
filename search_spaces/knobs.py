"""Knobs: one named decision of a schedule, with its finite, ordered domain."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

KnobKind = Literal["tile", "categorical", "compute_location", "annotation", "choice"]

# Knob value types: a tile is a tuple of factors, every other kind an int.
Value = Any


@dataclass(frozen=True)
class Knob:
    """One decision of a sketch or template.

    Attributes:
        name: readable and stable across processes (``tile.yy``, ``unroll_explicit``...).
        kind: ``tile`` (factors of one loop, outermost first), ``categorical`` (index into
            ``candidates``), ``compute_location`` (TVM's loop index, -1 root, -2 inline),
            ``annotation`` (the value of a block annotation such as the parallel extent) or
            ``choice`` (a template's own knob; the value itself).
        choices: every value the knob may take, in a fixed order (neighbours are adjacent).
        candidates: for ``categorical``, what each index stands for (e.g. unroll steps).
        conditional: the valid values also depend on other knobs (TVM's compute locations
            depend on which tiled loops have extent 1); such points are checked on apply.
    """

    name: str
    kind: KnobKind
    choices: tuple[Value, ...]
    candidates: tuple[int, ...] = ()
    conditional: bool = False

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"knob {self.name!r} has an empty domain")

    def __len__(self) -> int:
        return len(self.choices)

    def index(self, value: Value) -> int:
        """Position of ``value`` in the domain.

        Raises:
            ValueError: ``value`` is not in the domain.
        """
        return self._positions[value]

    @functools.cached_property
    def _positions(self) -> _Positions:
        return _Positions({v: i for i, v in enumerate(self.choices)}, self.name)

    def neighbours(self, value: Value) -> list[Value]:
        """Values one step away: adjacent in the domain, or for a tile, one prime factor
        moved from one loop level to another."""
        if self.kind == "tile":
            out = [v for v in _move_one_prime(value) if v in self._positions.table]
            return sorted(set(out), key=self._positions.table.__getitem__)
        i = self.index(value)
        return [self.choices[j] for j in (i - 1, i + 1) if 0 <= j < len(self.choices)]

    def describe(self, value: Value) -> str:
        """Human-readable value: the unroll step for a categorical index, else the value."""
        if self.kind == "categorical" and self.candidates:
            return str(self.candidates[int(value)])
        return str(value)


class _Positions:
    def __init__(self, table: dict[Value, int], name: str) -> None:
        self.table = table
        self.name = name

    def __getitem__(self, value: Value) -> int:
        try:
            return self.table[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not in the domain of knob {self.name!r}") from None


def tile_choices(extent: int, levels: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """Every ordered factorization of ``extent`` into ``levels`` factors whose innermost
    factor is at most ``max_innermost`` (the domain of TVM's ``SamplePerfectTile``)."""
    return tuple(t for t in _factorizations(extent, levels) if t[-1] <= max_innermost)


@functools.cache
def _factorizations(n: int, levels: int) -> tuple[tuple[int, ...], ...]:
    if levels == 1:
        return ((n,),)
    out: list[tuple[int, ...]] = []
    for d in divisors(n):
        out.extend((d, *rest) for rest in _factorizations(n // d, levels - 1))
    return tuple(out)


@functools.cache
def divisors(n: int) -> tuple[int, ...]:
    """The positive divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def _primes(n: int) -> Iterator[int]:
    p = 2
    while p * p <= n:
        while n % p == 0:
            yield p
            n //= p
        p += 1
    if n > 1:
        yield n


def _move_one_prime(tile: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    for src, f in enumerate(tile):
        for p in set(_primes(f)):
            for dst in range(len(tile)):
                if dst != src:
                    t = list(tile)
                    t[src] //= p
                    t[dst] *= p
                    yield tuple(t)
