"""Splitting a task's trials between its search spaces (sketch, templates) by results."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence


class SpaceBandit:
    """UCB1 over a task's spaces, rewarded by the best speed each space has found.

    A space's reward is its best measured speed relative to the best of all spaces (1 for
    the leader, 0 for a space with no success yet), plus an exploration bonus
    ``c * sqrt(ln(total trials) / trials of the space)``. Every space gets trials before any
    gets a second share. The best (not the mean) is what matters: the job keeps only the
    fastest schedule of a task, so a space that finds one very fast point beats a space
    whose points are all fair.
    """

    def __init__(self, kinds: Sequence[str], *, c: float = 0.5) -> None:
        if not kinds:
            raise ValueError("a bandit needs at least one space")
        self.kinds = list(kinds)
        self.c = c
        self.trials = [0] * len(self.kinds)
        self.best_sec: list[float | None] = [None] * len(self.kinds)

    def choose(self, exclude: Collection[int] = ()) -> int:
        """Index of the space that gets the next batch, among those not in ``exclude``.

        Raises:
            ValueError: every space is excluded.
        """
        open_ = [i for i in range(len(self.kinds)) if i not in exclude]
        if not open_:
            raise ValueError("every space is excluded")
        for i in open_:
            if self.trials[i] == 0:
                return i
        return max(open_, key=self.score)

    def score(self, i: int) -> float:
        """UCB score of space ``i``."""
        known = [s for s in self.best_sec if s is not None]
        reward = min(known) / self.best_sec[i] if known and self.best_sec[i] is not None else 0.0  # type: ignore[operator]
        total = sum(self.trials)
        return reward + self.c * math.sqrt(math.log(max(total, 1)) / max(self.trials[i], 1))

    def update(self, i: int, trials: int, best_sec: float | None) -> None:
        """Account ``trials`` more trials of space ``i`` and the best time they gave."""
        self.trials[i] += trials
        if best_sec is not None and (self.best_sec[i] is None or best_sec < self.best_sec[i]):
            self.best_sec[i] = best_sec
