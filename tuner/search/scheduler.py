"""Task scheduler: spends the trial budget where it can save the most model latency."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuner.tasks import Task


class TaskScheduler:
    """Gradient-style allocation over tasks.

    Every task first gets one batch (so each has a measured schedule, and compile never
    falls back for lack of trials when the budget allows). After that the next batch goes to
    the task whose share of the model's estimated latency (weight x best time, or weight x
    FLOPs before any success) is largest, discounted by the trials it already had.
    """

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.tasks = list(tasks)
        self.trials = [0] * len(self.tasks)
        self.best_sec: list[float | None] = [None] * len(self.tasks)

    def next_task(self) -> int:
        """Index of the task to give the next batch to."""
        for i, n in enumerate(self.trials):
            if n == 0:
                return i
        return max(range(len(self.tasks)), key=self._priority)

    def update(self, index: int, trials: int, best_sec: float | None) -> None:
        """Account ``trials`` more trials of task ``index`` and its best time so far."""
        self.trials[index] += trials
        if best_sec is not None and (self.best_sec[index] is None or best_sec < self.best_sec[index]):
            self.best_sec[index] = best_sec

    def _priority(self, i: int) -> float:
        task = self.tasks[i]
        best = self.best_sec[i]
        cost = task.weight * (best if best is not None else max(task.flops, 1.0) * 1e-9)
        return cost / math.sqrt(1 + self.trials[i])
