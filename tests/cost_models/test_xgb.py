import numpy as np
import tvm
import xgboost as xgb
from tvm import te

import cost_models
from cost_models import StoreFeatures
from cost_models.features import FEATURE_WIDTH
from cost_models.metrics import pairwise_accuracy
from search_spaces import create


def _matmul(n: int = 64) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def _stores(n: int, seed: int) -> tuple[StoreFeatures, np.ndarray]:
    """Candidates whose speed is a sum of a per-store term, as a schedule's time is."""
    rng = np.random.default_rng(seed)
    per = [rng.uniform(0, 1, (int(rng.integers(1, 6)), 10)).astype(np.float32) for _ in range(n)]
    return StoreFeatures.from_list(per, 10), np.array([float((3 * r[:, 0] + r[:, 1]).sum()) for r in per])


def test_per_store_features_of_real_schedules(cpu_device):
    mod = _matmul()
    space = create(mod, cpu_device.target)
    rng = np.random.default_rng(0)
    feats = cost_models.extract_features(mod, cpu_device.target, [space.apply(space.sample(rng)) for _ in range(8)])
    assert len(feats) == 8 and feats.width == FEATURE_WIDTH
    assert np.isfinite(feats.rows).all()
    assert all(len(feats.candidate(i)) >= 1 for i in range(8))
    picked = feats[[5, 2]]
    assert len(picked) == 2
    np.testing.assert_array_equal(picked.candidate(0), feats.candidate(5))
    assert len({feats.candidate(i).tobytes() for i in range(8)}) > 1


def test_store_features_index_and_concat():
    feats, _ = _stores(6, 0)
    both = StoreFeatures.concat([feats[:2], feats[2:]])
    np.testing.assert_array_equal(both.rows, feats.rows)
    np.testing.assert_array_equal(both.offsets, feats.offsets)
    mask = np.array([True, False, True, False, False, True])
    assert len(feats[mask]) == 3 and len(feats[np.array([], dtype=int)]) == 0
    np.testing.assert_array_equal(feats[mask].candidate(2), feats.candidate(5))


def test_both_objectives_rank_held_out_candidates():
    x, y = _stores(400, 1)
    test_x, test_y = _stores(100, 2)
    for objective in ("rank", "mse"):
        model = cost_models.create("xgb", seed=0, objective=objective)
        model.fit(x, y, np.zeros(400, dtype=int))
        acc = pairwise_accuracy(model.predict(test_x), test_y)
        assert acc > 0.85, (objective, acc)


def test_retrains_only_when_data_grew_enough():
    x, y = _stores(200, 3)
    g = np.zeros(200, dtype=int)
    model = cost_models.create("xgb", seed=0)
    model.update(x[:100], y[:100], g[:100])
    first = model._booster
    model.update(x[100:110], y[100:110], g[100:110])  # 10% more: kept
    assert model._booster is first and model.num_samples == 100
    model.update(x[110:125], y[110:125], g[110:125])  # 25% more: retrained
    assert model._booster is not first and model.num_samples == 125


def test_saved_as_ubjson_and_training_continues_from_a_loaded_model():
    x, y = _stores(200, 4)
    g = np.zeros(200, dtype=int)
    model = cost_models.create("xgb", seed=0)
    model.fit(x[:100], y[:100], g[:100])
    blob = model.save()
    assert blob[:1] == b"{"  # UBJSON object marker
    booster = xgb.Booster()
    booster.load_model(bytearray(blob))
    assert booster.attr("nightshift_num_samples") == "100"
    later = cost_models.create("xgb", seed=0)
    later.load(blob)
    rounds = later._booster.num_boosted_rounds()
    later.update(x[100:], y[100:], g[100:])
    assert later.num_samples == 200
    assert later._booster.num_boosted_rounds() > rounds  # trees added to the loaded ones


def test_unknown_option_is_rejected():
    import pytest

    with pytest.raises(TypeError, match="num_round"):
        cost_models.create("xgb", num_round=3)
