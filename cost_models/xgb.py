"""XGBoost cost model trained online on measured throughputs."""

from __future__ import annotations

import logging

import numpy as np
import xgboost as xgb

from cost_models.base import CostModel

logger = logging.getLogger(__name__)


class XGBCostModel(CostModel):
    """Gradient-boosted trees regressing per-task normalized throughput.

    Throughputs are divided by the best of their task so that tasks of very different
    sizes share one model; failed candidates count as 0.
    """

    def __init__(self, *, num_rounds: int = 50, max_depth: int = 6, seed: int = 0) -> None:
        self._params = {
            "max_depth": max_depth, "eta": 0.2, "subsample": 1.0, "min_child_weight": 1,
            "objective": "reg:squarederror", "seed": seed, "nthread": 1, "verbosity": 0,
        }  # fmt: skip
        self._num_rounds = num_rounds
        self._x: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._g: list[np.ndarray] = []
        self._booster: xgb.Booster | None = None

    @property
    def num_samples(self) -> int:
        return int(sum(len(y) for y in self._y))

    def update(self, features: np.ndarray, throughputs: np.ndarray, groups: np.ndarray) -> None:
        if len(features) == 0:
            return
        self._x.append(np.asarray(features, dtype=np.float32))
        self._y.append(np.asarray(throughputs, dtype=np.float64))
        self._g.append(np.asarray(groups))
        x, y, g = np.concatenate(self._x), np.concatenate(self._y), np.concatenate(self._g)
        target = np.zeros_like(y)
        for group in np.unique(g):
            mask = g == group
            best = y[mask].max()
            if best > 0:
                target[mask] = y[mask] / best
        self._booster = xgb.train(
            self._params, xgb.DMatrix(x, label=target), num_boost_round=self._num_rounds
        )
        logger.debug("cost model retrained on %d samples", len(y))

    def predict(self, features: np.ndarray) -> np.ndarray:
        if self._booster is None or len(features) == 0:
            return np.zeros(len(features))
        return self._booster.predict(xgb.DMatrix(np.asarray(features, dtype=np.float32)))

    def save(self) -> bytes:
        if self._booster is None:
            return b""
        return bytes(self._booster.save_raw(raw_format="ubj"))
