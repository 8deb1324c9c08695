"""The cost-model interface."""

from __future__ import annotations

import abc

import numpy as np


class CostModel(abc.ABC):
    """Predicts the relative speed of candidate schedules from their feature vectors.

    Contract: ``update`` adds measurements and retrains; ``predict`` returns one score per
    row, higher meaning faster, comparable only among candidates of the same task. Before the
    first ``update`` every score is 0. Models are not thread-safe.
    """

    @abc.abstractmethod
    def update(self, features: np.ndarray, throughputs: np.ndarray, groups: np.ndarray) -> None:
        """Add measured candidates and retrain.

        Args:
            features: (n, d) feature rows.
            throughputs: (n,) measured speed (e.g. GFLOPS); 0 for failed candidates.
            groups: (n,) task index of each row; scores are normalized per task.
        """

    @abc.abstractmethod
    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores for (n, d) feature rows, higher is faster."""

    @property
    @abc.abstractmethod
    def num_samples(self) -> int:
        """Number of measurements the model was trained on."""

    @abc.abstractmethod
    def save(self) -> bytes:
        """Serialize in a format safe to load from a shared database (never pickle)."""
