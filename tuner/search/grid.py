"""``grid``: every point of a small space, in order, once."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from cost_models import CostModel
from search_spaces import Point, SearchSpace
from tuner.search.base import MAX_ENUMERATE, Candidate, Proposal, SearchStrategy

logger = logging.getLogger(__name__)


class GridSearch(SearchStrategy):
    """Walks the knob grid sketch by sketch, knobs in lexicographic order, skipping points
    already seen and points the space rejects.

    Raises:
        ValueError: (on construction) the grid has more than ``max_points`` points; listing it
            is not a search. Choose another strategy for such spaces.
    """

    name = "grid"

    def __init__(self, space: SearchSpace, *, max_points: int = MAX_ENUMERATE, **kwargs) -> None:
        super().__init__(space, **kwargs)
        size = space.grid_size()
        if size > max_points:
            raise ValueError(f"grid search: the {space.kind} space has {size} grid points, more than "
                             f"{max_points}; use another strategy (e.g. evolutionary)")
        self._walk = self._points()

    def _points(self) -> Iterator[Point]:
        for s in range(self.space.num_sketches):
            for values in itertools.product(*(k.choices for k in self.space.knobs(s))):
                yield Point(s, tuple(values))

    def _propose(self, n: int, model: CostModel | None) -> Proposal:
        out: list[Candidate] = []
        while len(out) < n:
            # Seen points are skipped before applying: a resumed grid costs no replays. What
            # is still wanted is applied together (one round of Ray tasks with an applier).
            points = list(itertools.islice((p for p in self._walk if not self._is_seen(p.to_json())), n - len(out)))
            if not points:
                break
            out += [c for c in self._apply_many(points) if c is not None]
        return Proposal(out)
