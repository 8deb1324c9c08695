import numpy as np
import pytest
import tvm
import xgboost as xgb
from tvm import te

import cost_models
from cost_models.features import FEATURE_WIDTH
from search_spaces import create


def _matmul(n: int = 64) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def test_features_differ_between_schedules(cpu_device):
    mod = _matmul()
    space = create(mod, cpu_device.target)
    rng = np.random.default_rng(0)
    feats = cost_models.extract_features(mod, cpu_device.target, [space.apply(space.sample(rng)) for _ in range(8)])
    assert feats.shape == (8, FEATURE_WIDTH)
    assert np.isfinite(feats).all()
    assert len({row.tobytes() for row in feats}) > 1


def test_xgb_learns_a_ranking_and_saves_as_ubjson():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (200, 10)).astype(np.float32)
    y = 3 * x[:, 0] + x[:, 1]  # a throughput that depends on two features
    model = cost_models.create("xgb")
    assert np.all(model.predict(x) == 0)
    model.update(x, y, np.zeros(200, dtype=int))
    assert model.num_samples == 200
    corr = np.corrcoef(model.predict(x), y)[0, 1]
    assert corr > 0.9
    booster = xgb.Booster()
    booster.load_model(bytearray(model.save()))
    np.testing.assert_allclose(booster.predict(xgb.DMatrix(x)), model.predict(x), rtol=1e-5)


def test_unknown_cost_model():
    with pytest.raises(ValueError, match="xgb"):
        cost_models.create("nope")
