"""A model that knows nothing: the baseline every learned model must beat."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from cost_models.base import CostModel, Features
from cost_models.features import as_store_features


class RandomCostModel(CostModel):
    """Scores each candidate with a uniform number in [0, 1) drawn from a hash of its features
    and the seed, once it has seen any data (zeros before, as the contract says).

    The score is a fixed function of the features rather than a stream of draws, so a
    candidate keeps its score across calls and a saved model predicts exactly as before.
    """

    name = "random"

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self._n = 0

    @property
    def num_samples(self) -> int:
        return self._n

    def fit(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        self._n = int(np.isfinite(np.asarray(throughputs, dtype=float)).sum())

    def update(self, features: Features, throughputs: np.ndarray, groups: np.ndarray) -> None:
        self._n += int(np.isfinite(np.asarray(throughputs, dtype=float)).sum())

    def predict(self, features: Features) -> np.ndarray:
        feats = as_store_features(features)
        if self._n == 0:
            return np.zeros(len(feats))
        out = np.empty(len(feats))
        salt = self.seed.to_bytes(8, "little", signed=True)
        for i in range(len(feats)):
            digest = hashlib.blake2b(feats.candidate(i).tobytes(), digest_size=8, key=salt).digest()
            out[i] = int.from_bytes(digest, "little") / 2.0**64
        return out

    def save(self) -> bytes:
        """JSON: the seed and the sample count (empty when untrained)."""
        if self._n == 0:
            return b""
        return json.dumps({"kind": self.name, "seed": self.seed, "num_samples": self._n}).encode()

    def load(self, blob: bytes) -> None:
        if not blob:
            self._n = 0
            return
        try:
            state = json.loads(blob)
            if state.get("kind") != self.name:
                raise ValueError(f"a {state.get('kind')!r} model, not {self.name!r}")
            self.seed, self._n = int(state["seed"]), int(state["num_samples"])
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a random cost model: {err}") from err
