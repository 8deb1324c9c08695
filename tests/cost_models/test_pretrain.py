"""Pre-training from stored records, persistence per device family, and ``nightshift model eval``."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from cm_workloads import matmul
from tvm import te
from tvm.s_tir import meta_schedule as ms

import cost_models
import search_spaces
from cost_models.dataset import load_dataset
from tuner.db import NewRecord, TuningDatabase
from tuner.device import Device
from tuner.graph.keys import workload_key


def _matmul(n: int = 32) -> tvm.IRModule:
    return matmul(n)


def _reduce(n: int = 32, m: int = 256) -> tvm.IRModule:
    a = te.placeholder((n, m), name="A")
    r = te.reduce_axis((0, m), name="r")
    s = te.compute((n,), lambda i: te.sum(a[i, r], axis=r), name="S")
    return tvm.IRModule({"main": te.create_prim_func([a, s]).with_attr("global_symbol", "row_sum")})


def _other_machine(base: Device, **desc) -> Device:
    return Device(kind="cpu", index=0, target_config=dict(base.target_config), description=base.description | desc)


def _shipped_samples() -> int:
    from cost_models.pretrained import shipped_model

    model = cost_models.create("xgb")
    model.load(shipped_model("cpu") or b"")
    return model.num_samples


def _fill(db: TuningDatabase, device: Device, points: int = 12, jobs: bool = False) -> dict[str, int]:
    """Real schedules' records of two workloads; run times are made up (this test is about
    plumbing, test_quality about real timings): one failed and one early-stopped record each.
    With ``jobs``, each workload's records belong to a job of another model."""
    target = device.target
    dev_id = db.device_id(device)
    counts = {"ok": 0, "failed": 0, "early": 0}
    for name, mod in (("matmul", _matmul()), ("row_sum", _reduce())):
        key = workload_key(mod)
        db.workload_id(key, name, mod, 1e6)
        space = search_spaces.create(mod, target)
        rng = np.random.default_rng(0)
        seen = {}
        for _ in range(points * 4):
            p = space.sample(rng)
            seen.setdefault(p.to_json(), p)
            if len(seen) == points:
                break
        args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        records = []
        for i, (text, p) in enumerate(seen.items()):
            sch = space.apply(p)
            secs = [1e-4 * (1 + i)] * 3
            rec = ms.database.TuningRecord(sch.trace, ms.database.Workload(mod), secs, target, args)
            error = msg = None
            if i == 0:
                error, msg, secs = "BUILD_ERROR", "made-up failure", []
                counts["failed"] += 1
            elif i == 1:
                msg = "stopped early: at least 0.01 s (probe only)"
                counts["early"] += 1
            else:
                counts["ok"] += 1
            records.append(NewRecord(workload_key=key, point=text, record_json=json.dumps(rec.as_json()),
                                     run_secs=secs, error_class=error, error_msg=msg))  # fmt: skip
        job = db.start_job(f"net-{name}", dev_id, {}, len(records)) if jobs else None
        db.add_records(dev_id, job, records)
    return counts


@pytest.fixture(scope="module")
def filled(tmp_path_factory, cpu_device) -> tuple[Path, dict[str, int]]:
    path = tmp_path_factory.mktemp("cm") / "tuning.db"
    db = TuningDatabase(str(path))
    counts = _fill(db, cpu_device, jobs=True)
    db.close()
    return path, counts


def test_dataset_rebuilds_features_and_labels(filled, cpu_device):
    path, counts = filled
    data = load_dataset(TuningDatabase(str(path), create=False), cpu_device)
    assert len(data) == counts["ok"] + counts["failed"]  # early-stopped probes are no labels
    assert (data.throughputs == 0).sum() == counts["failed"]
    assert len(set(data.groups.tolist())) == 2 and set(data.names.values()) == {"matmul", "row_sum"}
    assert data.features.width == cost_models.features.FEATURE_WIDTH
    # Slower records (larger i) have lower throughput: labels follow the stored times.
    ok = data.throughputs > 0
    assert data.throughputs[ok].max() / data.throughputs[ok].min() > 3


def test_features_are_rebuilt_once_per_host(filled, cpu_device, tmp_path, monkeypatch, caplog):
    path, counts = filled
    monkeypatch.setenv("NIGHTSHIFT_CACHE", str(tmp_path / "cache"))
    db = TuningDatabase(str(path), create=False)

    def load(**kw):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="cost_models.dataset"):
            data = load_dataset(db, cpu_device, **kw)
        (line,) = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
        return data, int(re.search(r"(\d+) rebuilt", line).group(1))

    first, rebuilt = load()
    assert rebuilt == counts["ok"] + counts["failed"] and (tmp_path / "cache" / "features.sqlite").is_file()
    again, rebuilt = load()
    assert rebuilt == 0  # a later job's start reads them from the cache
    np.testing.assert_array_equal(again.features.rows, first.features.rows)
    np.testing.assert_array_equal(again.features.offsets, first.features.offsets)
    np.testing.assert_array_equal(again.throughputs, first.throughputs)
    assert again.groups.tolist() == first.groups.tolist()
    # Features for another target are other features: rebuilt, not read.
    other = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2})
    _, rebuilt = load(target=other)
    assert rebuilt == counts["ok"] + counts["failed"]


def test_pretrain_trains_on_the_family_records(filled, cpu_device):
    path, counts = filled
    db = TuningDatabase(str(path), create=False)
    model = cost_models.pretrain(db, cpu_device, seed=0)
    assert model.num_samples == counts["ok"] + counts["failed"]
    peer = _other_machine(cpu_device, model="a teammate's CPU")  # same arch, other fingerprint
    db.device_id(peer)
    assert cost_models.pretrain(db, peer).num_samples == model.num_samples
    # Without the family's records or models: the model shipped in the package.
    assert cost_models.pretrain(db, peer, same_arch=False).num_samples == _shipped_samples()


def test_stored_model_is_loaded_for_the_family(tmp_path, cpu_device):
    db = TuningDatabase(str(tmp_path / "models.db"))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (80, cost_models.features.FEATURE_WIDTH)).astype(np.float32)
    trained = cost_models.create("xgb", seed=0)
    trained.fit(x, x[:, 0] + x[:, 1], np.zeros(80, dtype=int))
    db.save_cost_model(db.device_id(cpu_device), "xgb", trained.save(), trained.num_samples)
    peer = _other_machine(cpu_device, model="a teammate's CPU")
    db.device_id(peer)
    loaded = cost_models.pretrain(db, peer)
    np.testing.assert_array_equal(loaded.predict(x), trained.predict(x))
    stranger = Device(kind="cpu", index=0, target_config=cpu_device.target_config | {"mcpu": "x86-64"},
                      description=cpu_device.description | {"mcpu": "x86-64", "model": "an older CPU"})  # fmt: skip
    db.device_id(stranger)
    # Another architecture: nothing of the family's, so the shipped model.
    assert cost_models.pretrain(db, stranger).num_samples == _shipped_samples()


def test_model_eval_command(filled, capsys):
    from tuner.cli import main

    path, _ = filled
    out_json = path.parent / "eval.json"
    assert main(["model", "eval", "--db", str(path), "--holdout", "0.3", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "unseen tasks" in text and "held-out records" in text and "dense/matmul" in text
    assert "held-out models" in text and "net-matmul" in text
    rows = json.loads(out_json.read_text())
    assert {r["model"] for r in rows} == {"xgb", "random"}
    assert {r["split"] for r in rows} == {"unseen tasks", "held-out models", "held-out records"}
    assert all(0 <= r["pairwise"] <= 1 for r in rows if r["pairwise"] == r["pairwise"])
    # Both objectives by name, one split.
    assert main(["model", "eval", "--db", str(path), "--models", "xgb-rank", "xgb-mse", "--splits",
                 "held-out models", "--json", str(out_json)]) == 0  # fmt: skip
    rows = json.loads(out_json.read_text())
    assert {(r["model"], r["split"], r["tasks"]) for r in rows if r["family"] == "all"} == {
        ("xgb-rank", "held-out models", 2), ("xgb-mse", "held-out models", 2)}
    # --db repeated pools the databases' records (here one database twice: twice the records).
    capsys.readouterr()
    assert main(["model", "eval", "--db", str(path), "--splits", "held-out records", "--models", "random"]) == 0
    once = int(capsys.readouterr().out.split(" records of ")[0].split()[-1])
    assert main(["model", "eval", "--db", str(path), "--db", str(path), "--splits", "held-out records",
                 "--models", "random"]) == 0  # fmt: skip
    assert int(capsys.readouterr().out.split(" records of ")[0].split()[-1]) == 2 * once > 0


def test_model_train_command(filled, tmp_path, cpu_device, capsys):
    """Two databases (one of them the same twice over) train one model; it loads and predicts."""
    from tuner.cli import main

    path, counts = filled
    other = tmp_path / "other.db"
    db = TuningDatabase(str(other))
    peer = _other_machine(cpu_device, model="a teammate's CPU", cores=4)
    peer = Device(kind="cpu", index=0, target_config=peer.target_config | {"num-cores": 4},
                  description=peer.description)  # fmt: skip
    _fill(db, peer, points=8)
    db.close()
    model_path = tmp_path / "model.json"
    assert main(["model", "train", "--db", str(path), "--db", str(other), "-o", str(model_path)]) == 0
    assert "trained on" in capsys.readouterr().out
    prov = json.loads(model_path.with_suffix(".provenance.json").read_text())
    assert prov["format"] == "xgboost-json" and prov["objective"] == "rank"
    assert prov["feature_width"] == cost_models.features.FEATURE_WIDTH
    assert [s["models"] for s in prov["sources"]] == [["net-matmul", "net-row_sum"], []]
    assert prov["records"] == counts["ok"] + counts["failed"] + sum(s["records"] for s in prov["sources"][1:])
    assert {d["fingerprint"] for s in prov["sources"] for d in s["devices"] if d["records"]} == {
        cpu_device.fingerprint, peer.fingerprint}
    assert prov["command"].startswith("nightshift model train --db")
    model = cost_models.create("xgb")
    model.load(model_path.read_bytes())  # XGBoost's JSON, not a pickle
    assert json.loads(model_path.read_text())["learner"]
    data = load_dataset(TuningDatabase(str(path), create=False), cpu_device)
    assert np.isfinite(model.predict(data.features)).all() and model.num_samples == prov["records"]


def test_family_queries_on_both_backends(db_url, cpu_device):
    db = TuningDatabase(db_url)
    me, peer = db.device_id(cpu_device), db.device_id(_other_machine(cpu_device, model="a teammate's CPU"))
    other_arch = db.device_id(Device(kind="cpu", index=0, target_config=cpu_device.target_config | {"mcpu": "x86-64"},
                                     description=cpu_device.description | {"model": "an older CPU"}))  # fmt: skip
    db.save_cost_model(peer, "xgb", b"peer", 1)
    db.save_cost_model(other_arch, "xgb", b"stranger", 1)
    assert db.load_cost_model(me, "xgb") is None
    assert db.load_cost_model(me, "xgb", same_arch=True) == b"peer"
    mod = _reduce(8, 8)
    key = workload_key(mod)
    db.workload_id(key, "row_sum", mod, 64.0)
    for dev in (me, peer, other_arch):
        db.add_records(dev, None, [NewRecord(workload_key=key, point=f'{{"d": {dev}}}', record_json="{}",
                                             run_secs=[1e-3])])  # fmt: skip
    assert len(db.training_records(me, same_arch=False)) == 1
    got = db.training_records(me)
    teammate = _other_machine(cpu_device, model="a teammate's CPU").fingerprint
    assert len(got) == 2 and {fp for _, fp, _ in got} == {cpu_device.fingerprint, teammate}
    assert len(db.training_records(me, limit=1)) == 1
    db.close()
