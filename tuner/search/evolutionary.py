"""``evolutionary`` (the default): mutation and crossover over the explicit knobs, guided by
the cost model, seeded from the best measured points of the task."""

from __future__ import annotations

import logging

import numpy as np

from cost_models import CostModel
from search_spaces import Point, SearchSpace
from tuner.search.base import Candidate, Proposal, SearchStrategy

logger = logging.getLogger(__name__)


class EvolutionarySearch(SearchStrategy):
    """Evolves a population of points with the cost model as its fitness.

    Each ``propose``: the population starts from the ``population`` fastest points measured
    so far (this job's and every record told from the database: earlier jobs, teammates),
    topped up with fresh samples once the model has data to rank them. For ``generations``
    rounds, parents are drawn by predicted score (rank-weighted; by measured speed before the
    model has data) and each child is a mutation of one knob of a parent (tile factors: one
    prime factor moved between two loop levels, TVM's ``SamplePerfectTile`` domain; other
    knobs: a neighbour or any other value) or, with ``crossover`` probability, a uniform
    per-knob crossover of two parents of the same sketch (a combination MetaSchedule cannot
    make on opaque traces). Children that the space rejects or that were seen are dropped;
    the best of the population survive. The batch is the unseen candidates with the highest
    predicted scores, plus an ``epsilon`` share of fresh uniform samples so the model keeps
    seeing points it would not pick: at least one when ``n >= 2``, and with probability
    ``epsilon`` when ``n == 1``.
    """

    name = "evolutionary"

    def __init__(self, space: SearchSpace, *, population: int = 16, generations: int = 2,
                 children_per_candidate: int = 2, crossover: float = 0.3, epsilon: float = 0.2,
                 **kwargs) -> None:  # fmt: skip
        super().__init__(space, **kwargs)
        if population < 1 or generations < 1 or children_per_candidate < 1:
            raise ValueError("population, generations and children_per_candidate must be positive")
        if not 0 <= crossover <= 1 or not 0 <= epsilon <= 1:
            raise ValueError("crossover and epsilon are probabilities in [0, 1]")
        self.population = population
        self.generations = generations
        self.children_per_candidate = children_per_candidate
        self.crossover = crossover
        self.epsilon = epsilon

    def random_share(self, n: int, *, evolved: bool = True) -> int:
        """How many of a batch of ``n`` are fresh uniform samples."""
        if not evolved:
            return n
        if n == 1:
            return int(self.rng.random() < self.epsilon)
        return min(n - 1, max(1, round(self.epsilon * n))) if self.epsilon > 0 else 0

    def _propose(self, n: int, model: CostModel | None) -> Proposal:
        trained = model is not None and model.num_samples > 0
        measured = self.best(self.population)
        parents: list[Candidate] = []
        # Measured parents' fitness before the model knows anything: their measured speed.
        fitness: dict[str, float] = {}
        for (sec, _), cand in zip(measured, self._apply_many([p for _, p in measured]), strict=True):
            if cand is not None:
                parents.append(cand)
                fitness[cand.id] = measured[0][0] / sec
        n_random = self.random_share(n, evolved=bool(parents))
        if n_random == n:
            return Proposal(self._fresh(n))
        # Fresh samples join the population only when the model can rank them; before, they
        # carry no evidence, and breeding stays with the measured points (the batch's random
        # share explores).
        fresh = self._fresh(max(self.population - len(parents), 0)) if trained else []
        pop = parents + fresh
        pool: dict[str, Candidate] = {c.id: c for c in fresh}
        scores = self._rank(model if trained else None, pop, fitness)
        for _ in range(self.generations):
            born = self._children(pop, scores, max(self.children_per_candidate * n, self.population), pool)
            children = [c for c, _ in born]
            for c, parent in born:
                pool[c.id] = c
                # Without a model a child is presumed a little worse than its parent: the
                # children of the fastest measured points go first, fresh samples last.
                fitness[c.id] = 0.9 * fitness.get(parent, 0.0)
            child_scores = self._rank(model if trained else None, children, fitness)
            merged = pop + children
            all_scores = np.concatenate([scores, child_scores])
            keep = np.argsort(-all_scores, kind="stable")[: self.population]
            pop, scores = [merged[i] for i in keep], all_scores[keep]
        # Pick from the unseen pool by predicted score: the population's survivors first, then
        # any other child (without a model every score is 0 and the order is the pool's).
        survivors = [c for c in pop if c.id in pool]
        ranked = survivors + [c for c in pool.values() if c.id not in {s.id for s in survivors}]
        chosen = ranked[: n - n_random]
        taken = {c.id for c in chosen}
        chosen += self._fresh(n - len(chosen), exclude=taken)
        return Proposal(chosen)

    def _rank(self, model: CostModel | None, cands: list[Candidate], fitness: dict[str, float]) -> np.ndarray:
        if not cands:
            return np.zeros(0)
        if model is None:
            return np.array([fitness.get(c.id, 0.0) for c in cands])
        return self._score(model, cands)

    def _children(self, pop: list[Candidate], scores: np.ndarray, count: int,
                  pool: dict[str, Candidate]) -> list[tuple[Candidate, str]]:  # fmt: skip
        """Up to ``count`` new valid children of the population, none seen or in ``pool``,
        each with the id of its (first) parent."""
        if not pop:
            return []
        # Rank weights: the best parent is drawn most often, every parent has a chance.
        order = np.argsort(-scores, kind="stable")
        weights = np.empty(len(pop))
        weights[order] = 1.0 / (1.0 + np.arange(len(pop)))
        weights /= weights.sum()
        by_sketch: dict[int, list[int]] = {}
        for i, c in enumerate(pop):
            by_sketch.setdefault(c.point.sketch, []).append(i)
        out: dict[str, tuple[Candidate, str]] = {}
        draws = 0
        # Children are drawn as points, then applied together (one round of Ray tasks with an
        # applier); the rounds repeat while some were invalid.
        while len(out) < count and draws < 4 * count:
            points: dict[str, tuple[Point, str]] = {}
            while len(out) + len(points) < count and draws < 4 * count:
                draws += 1
                a = pop[int(self.rng.choice(len(pop), p=weights))]
                mates = [i for i in by_sketch[a.point.sketch] if pop[i].id != a.id]
                if mates and self.rng.random() < self.crossover:
                    w = weights[mates] / weights[mates].sum()
                    b = pop[int(self.rng.choice(mates, p=w))]
                    child = self._crossover(a.point, b.point)
                else:
                    child = self._mutate(a.point)
                if child is None:
                    continue
                key = child.to_json()
                if self._is_seen(key) or key in pool or key in out or key in points:
                    continue
                points[key] = (child, a.id)
            made = self._apply_many([p for p, _ in points.values()])
            for (key, (_, parent)), cand in zip(points.items(), made, strict=True):
                if cand is not None:
                    out[key] = (cand, parent)
        return list(out.values())

    def _mutate(self, point: Point) -> Point | None:
        knobs = self.space.knobs(point.sketch)
        movable = [i for i, k in enumerate(knobs) if len(k) > 1]
        if not movable:
            return None
        i = movable[int(self.rng.integers(len(movable)))]
        knob, value = knobs[i], point.decisions[i]
        # Small steps (a prime factor moved between tile levels, an adjacent unroll depth)
        # keep most of what made the parent fast; a uniform jump now and then escapes.
        near = knob.neighbours(value) if not knob.conditional else []
        if near and self.rng.random() < 0.7:
            new_value = near[int(self.rng.integers(len(near)))]
        else:
            others = [v for v in knob.choices if v != value]
            new_value = others[int(self.rng.integers(len(others)))]
        decisions = list(point.decisions)
        decisions[i] = new_value
        return Point(point.sketch, tuple(decisions))

    def _crossover(self, a: Point, b: Point) -> Point | None:
        mask = self.rng.random(len(a.decisions)) < 0.5
        child = Point(a.sketch, tuple(x if m else y for x, y, m in zip(a.decisions, b.decisions, mask, strict=True)))
        return None if child in (a, b) else child
