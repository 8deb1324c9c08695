"""Every registered cost model must pass these: adding a model means adding it to ``kinds()``."""

from __future__ import annotations

import numpy as np
import pytest

import cost_models
from cost_models import StoreFeatures


def _data(n: int = 120, seed: int = 0) -> tuple[StoreFeatures, np.ndarray, np.ndarray]:
    """Candidates of two tasks with 1-4 stores each; speed is a sum over stores."""
    rng = np.random.default_rng(seed)
    per = [rng.uniform(0, 1, (int(rng.integers(1, 5)), 12)).astype(np.float32) for _ in range(n)]
    y = np.array([float((2 * r[:, 0] + r[:, 1] ** 2).sum()) for r in per])
    groups = np.where(np.arange(n) % 2 == 0, "task-a", "task-b")
    return StoreFeatures.from_list(per, 12), y, groups


@pytest.fixture(params=cost_models.kinds())
def kind(request) -> str:
    return request.param


def test_untrained_model_predicts_zeros(kind):
    feats, _, _ = _data(10)
    model = cost_models.create(kind, seed=0)
    assert model.num_samples == 0
    np.testing.assert_array_equal(model.predict(feats), np.zeros(10))
    assert model.predict(np.zeros((0, 0))).shape == (0,)


def test_fit_predict_shapes(kind):
    feats, y, g = _data()
    model = cost_models.create(kind, seed=0)
    model.fit(feats, y, g)
    assert model.num_samples == len(y)
    pred = model.predict(feats[[3, 1, 4]])
    assert pred.shape == (3,) and np.isfinite(pred).all()
    assert not np.all(model.predict(feats) == 0)
    # A plain matrix is one store per row.
    flat = np.random.default_rng(1).uniform(0, 1, (7, 12)).astype(np.float32)
    assert model.predict(flat).shape == (7,)
    metrics = model.evaluate(feats, y, g)
    assert set(metrics) >= {"pairwise", "top1", "top5"} and metrics["tasks"] == 2


def test_save_load_round_trip_predicts_identically(kind):
    feats, y, g = _data()
    model = cost_models.create(kind, seed=3)
    assert model.save() == b""
    model.fit(feats, y, g)
    blob = model.save()
    assert isinstance(blob, bytes) and blob
    fresh = cost_models.create(kind, seed=3)
    fresh.load(blob)
    np.testing.assert_array_equal(fresh.predict(feats), model.predict(feats))
    assert fresh.num_samples == model.num_samples


def test_load_rejects_other_bytes(kind):
    with pytest.raises(ValueError):
        cost_models.create(kind).load(b"\x00not a model")


def test_update_is_deterministic_given_seed(kind):
    feats, y, g = _data()
    preds = []
    for _ in range(2):
        model = cost_models.create(kind, seed=5)
        for part in np.array_split(np.arange(len(y)), 3):
            model.update(feats[part], y[part], g[part])
        preds.append(model.predict(feats))
    np.testing.assert_array_equal(preds[0], preds[1])


def test_nan_labels_are_not_samples(kind):
    feats, y, g = _data(40)
    y[::4] = np.nan  # early-stopped probes
    model = cost_models.create(kind, seed=0)
    model.update(feats, y, g)
    assert model.num_samples == 30


def test_unknown_cost_model():
    with pytest.raises(ValueError, match="xgb"):
        cost_models.create("nope")
