"""The hardware descriptor in every feature row, and the model shipped in the package."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import tvm
from cm_workloads import matmul

import cost_models
import search_spaces
from cost_models.features import FEATURE_WIDTH, STORE_WIDTH
from cost_models.hardware import CPU_FEATURES, HARDWARE_NAMES, HARDWARE_WIDTH, hardware_descriptor
from tuner.db import TuningDatabase
from tuner.device import Device


def _matmul(n: int = 64) -> tvm.IRModule:
    return matmul(n)


def _schedules(target: tvm.target.Target, count: int = 6) -> tuple[tvm.IRModule, list]:
    mod = _matmul()
    space = search_spaces.create(mod, target)
    rng = np.random.default_rng(0)
    return mod, [space.apply(space.sample(rng)) for _ in range(count)]


def _cpu(mcpu: str, cores: int) -> Device:
    return Device(kind="cpu", index=0, target_config={"kind": "llvm", "mcpu": mcpu, "num-cores": cores},
                  description={"model": mcpu, "cores": cores})  # fmt: skip


def test_hardware_descriptor_is_distinct_per_device():
    avx2, avx512 = _cpu("haswell", 2), _cpu("skylake-avx512", 4)
    a, b = hardware_descriptor(avx2.target), hardware_descriptor(avx512.target)
    assert a.shape == b.shape == (HARDWARE_WIDTH,) and len(HARDWARE_NAMES) == HARDWARE_WIDTH
    named = dict(zip(HARDWARE_NAMES, b, strict=True))
    assert named["hw.avx512f"] == 1 and named["hw.vector_bits"] == 1 and named["hw.cores"] == 4
    assert named["hw.l2_kib"] == 1024 and named["hw.cpu"] == 1
    assert dict(zip(HARDWARE_NAMES, a, strict=True))["hw.avx512f"] == 0 and not np.array_equal(a, b)
    # A feature the mcpu has but the target turns off is off in the descriptor too.
    off = Device(kind="cpu", index=0, description={},
                 target_config={"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 4, "mattr": ["-avx512f"]})
    assert hardware_descriptor(off.target)[2 + CPU_FEATURES.index("avx512f")] == 0
    gpus = [hardware_descriptor(tvm.target.Target({"kind": "cuda", "arch": arch})) for arch in ("sm_80", "sm_90")]
    assert gpus[0][1] == 1 and not np.array_equal(gpus[0], gpus[1])


def test_features_carry_the_hardware_descriptor():
    devices = [_cpu("haswell", 2), _cpu("znver4", 8)]
    mod, schedules = _schedules(devices[0].target, 3)
    feats = [cost_models.extract_features(mod, d.target, schedules) for d in devices]
    assert feats[0].width == FEATURE_WIDTH == STORE_WIDTH + HARDWARE_WIDTH
    np.testing.assert_array_equal(feats[0].rows[:, :STORE_WIDTH], feats[1].rows[:, :STORE_WIDTH])
    for f, d in zip(feats, devices, strict=True):
        assert (f.rows[:, STORE_WIDTH:] == hardware_descriptor(d.target)).all()
    assert not np.array_equal(feats[0].rows, feats[1].rows)


def test_shipped_model_loads_from_the_package_and_predicts(cpu_device):
    files = resources.files("cost_models.pretrained")
    blob = (files / "xgb_cpu.json").read_bytes()
    assert blob.startswith(b"{") and len(blob) < 2 * 1024 * 1024  # XGBoost's JSON, small enough to commit
    prov = json.loads((files / "xgb_cpu.provenance.json").read_text())
    assert prov["format"] == "xgboost-json" and prov["records"] > 0 and prov["command"].startswith("nightshift")
    assert prov["sources"] and all(s["devices"] for s in prov["sources"])
    model = cost_models.create("xgb")
    model.load(blob)
    assert model.num_samples == prov["records"] and model.num_features == FEATURE_WIDTH
    mod, schedules = _schedules(cpu_device.target)
    scores = model.predict(cost_models.extract_features(mod, cpu_device.target, schedules))
    assert scores.shape == (len(schedules),) and np.isfinite(scores).all() and np.ptp(scores) > 0


def test_pretrain_on_an_empty_database_uses_the_shipped_model_and_fine_tunes_it(tmp_path, cpu_device):
    db = TuningDatabase(str(tmp_path / "empty.db"))
    db.device_id(cpu_device)
    model = cost_models.pretrain(db, cpu_device)
    shipped = cost_models.create("xgb")
    shipped.load(resources.files("cost_models.pretrained").joinpath("xgb_cpu.json").read_bytes())
    assert model.num_samples == shipped.num_samples > 0
    mod, schedules = _schedules(cpu_device.target, 24)
    feats = cost_models.extract_features(mod, cpu_device.target, schedules)
    np.testing.assert_array_equal(model.predict(feats), shipped.predict(feats))
    # The job's measurements add trees on top of the shipped ones.
    y = np.linspace(1.0, 10.0, len(schedules))
    model.update(feats, y, np.full(len(y), "matmul"))
    assert model.num_samples == shipped.num_samples + len(y)
    assert not np.array_equal(model.predict(feats), shipped.predict(feats))
    db.close()


def test_shipped_model_is_package_data():
    """A wheel carries the model: pyproject lists it as package data of its package."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "*.json" in pyproject["tool"]["setuptools"]["package-data"]["cost_models.pretrained"]
