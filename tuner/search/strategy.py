"""Proposing candidates: many random points, ranked by the cost model, plus exploration."""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm.s_tir import Schedule

from cost_models import CostModel, extract_features
from search_spaces import Point, SearchSpace

logger = logging.getLogger(__name__)


class ModelGuidedSampler:
    """Samples ``pool_factor`` x batch points, keeps the best by predicted score.

    A share ``epsilon`` of each batch is drawn uniformly so the cost model keeps seeing
    points it would not pick. Points already measured are never proposed again.
    """

    def __init__(self, *, pool_factor: int = 8, epsilon: float = 0.25, seed: int = 0) -> None:
        self.pool_factor = pool_factor
        self.epsilon = epsilon
        self.rng = np.random.default_rng(seed)

    def propose(
        self,
        space: SearchSpace,
        mod: tvm.IRModule,
        target: tvm.target.Target,
        model: CostModel,
        batch: int,
        seen: set[str],
    ) -> tuple[list[Point], list[Schedule], np.ndarray]:
        """Up to ``batch`` new points, their schedules and their feature rows."""
        pool: dict[str, Point] = {}
        for _ in range(batch * self.pool_factor * 2):
            if len(pool) >= batch * self.pool_factor:
                break
            try:
                p = space.sample(self.rng)
            except RuntimeError:
                break
            key = p.to_json()
            if key not in seen:
                pool[key] = p
        points = list(pool.values())
        if not points:
            return [], [], np.zeros((0, 0))
        schedules = [space.apply(p) for p in points]
        feats = extract_features(mod, target, schedules)
        scores = model.predict(feats)
        n_random = batch if model.num_samples == 0 else round(batch * self.epsilon)
        order = list(np.argsort(-scores, kind="stable"))
        chosen = order[: max(batch - n_random, 0)]
        rest = [i for i in order if i not in set(chosen)]
        if rest and n_random:
            chosen += list(self.rng.choice(rest, size=min(n_random, len(rest)), replace=False))
        chosen = chosen[:batch]
        return [points[i] for i in chosen], [schedules[i] for i in chosen], feats[chosen]
