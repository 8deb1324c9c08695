"""``random``: uniform samples of the space, the baseline every other strategy must beat."""

from __future__ import annotations

from cost_models import CostModel
from tuner.search.base import Proposal, SearchStrategy


class RandomSearch(SearchStrategy):
    """Each candidate drawn uniformly (a sketch, then each knob), ignoring the cost model."""

    name = "random"

    def _propose(self, n: int, model: CostModel | None) -> Proposal:
        return Proposal(self._fresh(n))
