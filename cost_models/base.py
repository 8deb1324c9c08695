"""The cost-model interface."""

from __future__ import annotations

import abc

import numpy as np

from cost_models.features import StoreFeatures

Features = StoreFeatures | np.ndarray


class CostModel(abc.ABC):
    """Predicts the relative speed of candidate schedules from their features.

    Contract:
        - Features are :class:`StoreFeatures` (what :func:`cost_models.extract_features`
          returns) or a plain ``(n, d)`` array, read as one store per row. A model trained on
          one width predicts only that width.
        - Labels are measured throughputs (e.g. GFLOPS), higher is faster; ``0`` for a failed
          candidate; ``NaN`` for a measurement that is no label (an early-stopped probe) and
          is dropped. ``groups`` names the task of each row (use the workload key so data of
          several jobs and of :func:`cost_models.pretrain` share groups); labels are
          normalized per group, and scores are comparable only within one task.
        - ``fit`` replaces the data and trains now; ``update`` adds data and retrains only
          when the data has grown enough since the last training (or nothing is trained yet).
        - ``predict`` gives one score per candidate, higher meaning faster; all zeros before
          the model was trained or loaded. Deterministic for a given seed and data.
        - ``save`` returns bytes in a format safe to load from a shared database (never a
          pickle); ``load`` replaces the trained state with them. A loaded model predicts as
          the saved one did; its training data is not in the bytes.
        - Not thread-safe: one model belongs to one thread at a time.
    """

    name: str = "base"

    @abc.abstractmethod
    def fit(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        """Replace the training data with these measurements and train now.

        Args:
            features: ``n`` candidates' features.
            throughputs: ``(n,)`` measured speed; 0 for failed candidates, NaN for no label.
            groups: ``(n,)`` task of each candidate (any hashable scalars; str or int).
        """

    @abc.abstractmethod
    def update(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        """Add measurements; retrain when the data has grown enough (see the class docstring)."""

    @abc.abstractmethod
    def predict(self, features: Features) -> np.ndarray:
        """``(n,)`` float scores, higher is faster."""

    @property
    @abc.abstractmethod
    def num_samples(self) -> int:
        """Measurements behind the current predictions (0: untrained, predicts zeros)."""

    @abc.abstractmethod
    def save(self) -> bytes:
        """The trained state as bytes (empty when untrained)."""

    @abc.abstractmethod
    def load(self, blob: bytes) -> None:
        """Replace the trained state with ``save()``'s bytes.

        Raises:
            ValueError: the bytes are not a model of this kind.
        """

    def evaluate(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> dict[str, float]:
        """TenSet's metrics on measurements the model was not trained on, averaged over tasks.

        Returns:
            ``pairwise`` (ranking accuracy), ``top1`` and ``top5`` (best true throughput among
            the model's top-k picks over the best true throughput), and ``tasks``.
        """
        from cost_models.metrics import evaluate_scores

        return evaluate_scores(self.predict(features), throughputs, groups)
