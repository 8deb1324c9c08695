"""Knob domains and moves, property-based."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_spaces.knobs import Knob, divisors, tile_choices


@given(extent=st.integers(1, 512), levels=st.integers(1, 4), max_inner=st.integers(1, 64))
@settings(max_examples=60, deadline=None)
def test_tile_choices_are_exactly_the_perfect_factorizations(extent, levels, max_inner):
    got = tile_choices(extent, levels, max_inner)
    assert len(set(got)) == len(got)
    assert all(len(t) == levels and math.prod(t) == extent and t[-1] <= max_inner for t in got)
    # Count them another way: every (levels-1)-tuple of divisors whose product divides.
    def count(n: int, k: int) -> int:
        if k == 1:
            return 1 if n <= max_inner else 0
        return sum(count(n // d, k - 1) for d in divisors(n))

    assert len(got) == count(extent, levels)


@given(extent=st.sampled_from([1, 7, 12, 56, 64, 3072]), levels=st.integers(2, 4), data=st.data())
@settings(max_examples=40, deadline=None)
def test_tile_neighbours_move_one_prime_and_stay_in_domain(extent, levels, data):
    knob = Knob("tile.x", "tile", tile_choices(extent, levels, 64))
    value = data.draw(st.sampled_from(knob.choices))
    for n in knob.neighbours(value):
        assert n in knob.choices and n != value and math.prod(n) == extent
        changed = [i for i in range(levels) if n[i] != value[i]]
        assert len(changed) == 2
        i, j = changed
        ratio = max(n[i] / value[i], value[i] / n[i])
        assert ratio == max(n[j] / value[j], value[j] / n[j]) and all(ratio % p for p in range(2, int(ratio)))
        assert value in knob.neighbours(n), "one-step moves are symmetric"


def test_ordered_knob_neighbours_are_adjacent():
    knob = Knob("unroll", "categorical", (0, 1, 2), candidates=(0, 16, 64))
    assert knob.neighbours(0) == [1]
    assert knob.neighbours(1) == [0, 2]
    assert knob.describe(2) == "64"
    with pytest.raises(ValueError, match="domain"):
        knob.index(3)


def test_empty_domain_is_refused():
    with pytest.raises(ValueError, match="empty"):
        Knob("k", "choice", ())


_VALUES = st.one_of(st.integers(-2, 2**31 - 1), st.tuples(st.integers(1, 4096), st.integers(1, 4096)),
                    st.lists(st.integers(1, 64), min_size=1, max_size=5).map(tuple))


@given(sketch=st.integers(0, 8), decisions=st.lists(_VALUES, max_size=12).map(tuple))
@settings(max_examples=100, deadline=None)
def test_point_json_round_trip_is_exact_and_canonical(sketch, decisions):
    from search_spaces import Point

    p = Point(sketch, decisions)
    text = p.to_json()
    assert Point.from_json(text) == p
    assert Point.from_json(text).to_json() == text
