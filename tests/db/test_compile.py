"""The compiler reads the database: records from a real small tuning run, fallbacks, the CLI."""

import json

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner import cli
from tuner.compile import FALLBACK_DESCRIPTION, compile_model, fallback_schedule, run_model
from tuner.db import TuningDatabase
from tuner.frontends import load_model
from tuner.graph.tasks import extract_tasks


@pytest.fixture(scope="module")
def tuned_tiny(tmp_path_factory, cpu_device):
    """The tiny zoo model tuned for a few trials into a fresh SQLite database (measured in this
    process: these tests are about the compiler, not about Ray)."""
    from tuner.job import TuneConfig, tune_tasks

    path = tmp_path_factory.mktemp("tuned") / "tiny.db"
    db = TuningDatabase(str(path))
    spec = load_model("tiny")
    tasks = extract_tasks(spec.bound(), cpu_device.target)
    # Tune only the two heaviest operators, so that the others need the fallback.
    summary = tune_tasks(tasks[:2], cpu_device, db, TuneConfig(trials=6, batch_size=3, measurer="inline"),
                         model_name="tiny")
    assert summary.best_sec, "the tuning run measured no working schedule"
    assert len(tasks) > 2
    return spec, db, path, tasks, summary


def _max_rel_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        scale = max(float(np.max(np.abs(x))), 1e-6)
        worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y))) / scale)
    return worst


def test_compile_uses_tuned_records_and_falls_back(tuned_tiny, cpu_device, tmp_path):
    spec, db, _path, tasks, summary = tuned_tiny
    compiled = compile_model(spec, cpu_device, db)
    kinds = {key: d.kind for key, d in compiled.decisions.items()}
    # Every tuned workload with a working schedule is read from the database...
    assert {k for k, v in kinds.items() if v == "tuned"} == set(summary.best_sec)
    # ...and every other operator gets the fallback, never TVM's naive lowering.
    assert set(kinds.values()) == {"tuned", "fallback"}
    assert {t.workload_key for t in tasks[2:]} <= {k for k, v in kinds.items() if v == "fallback"}
    assert {d.detail for d in compiled.decisions.values() if d.kind == "fallback"} <= {FALLBACK_DESCRIPTION}
    # Untuned functions are reported by their fused name (their workload's module says "main"),
    # and the database holds no older form of them.
    assert {t.name for t in tasks[2:]} <= {d.name for d in compiled.decisions.values() if d.kind == "fallback"}
    assert compiled.tuned_in_another_form(db) == []
    for key in summary.best_sec:
        best = db.best(key, db.device_id(cpu_device))[0]
        assert compiled.decisions[key].detail == f"{best.mean_sec * 1e3:.3f} ms"
    inputs = spec.random_inputs(seed=0)
    reference = compile_model(spec, cpu_device, None)
    want, _ = run_model(reference, cpu_device, inputs, budget_s=0.2)
    got, _ = run_model(compiled, cpu_device, inputs, budget_s=0.2)
    assert _max_rel_diff(want, got) < 1e-4
    # The deployable library loads and runs on its own.
    lib = tmp_path / "tiny.so"
    compiled.executable.export_library(str(lib))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    assert _max_rel_diff(want, [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [o.numpy() for o in out]) \
        < 1e-4  # fmt: skip
    # The compiler only reads: no workload or record was added.
    assert db.count_records() == summary.trials


def test_no_fallback_means_tvm_default(tuned_tiny, cpu_device):
    spec, db, *_ = tuned_tiny
    compiled = compile_model(spec, cpu_device, db, fallback=False)
    kinds = {d.kind for d in compiled.decisions.values()}
    assert "tvm-default" in kinds and "fallback" not in kinds


def test_fallback_schedule_is_parallel_and_vectorized(tuned_tiny, cpu_device):
    *_, tasks, _summary = tuned_tiny
    conv = next(t for t in tasks if "conv2d" in t.name)
    sch = fallback_schedule(conv.mod, cpu_device.target)
    assert sch is not None
    script = sch.mod.script()
    assert "T.parallel(" in script and "T.vectorized(" in script
    # Deterministic: the same module gives the same schedule.
    assert str(fallback_schedule(conv.mod, cpu_device.target).trace) == str(sch.trace)
    # And it computes the same thing as TVM's default lowering.
    args = [np.random.default_rng(0).standard_normal([int(d) for d in a.shape]).astype(a.dtype)
            for a in tvm.s_tir.meta_schedule.arg_info.ArgInfo.from_prim_func(conv.mod["main"])]  # fmt: skip
    outs = []
    for mod in (conv.mod, sch.mod):
        f = tvm.compile(mod, target=cpu_device.target).jit()
        bufs = [tvm.runtime.tensor(x) for x in args]
        f["main"](*bufs)
        outs.append(bufs[-1].numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_same_arch_records_are_flagged(tuned_tiny, cpu_device, tmp_path):
    """Another machine of the same architecture uses this one's records, and says so."""
    from dbtest_utils import fake_cpu

    spec, db, *_ = tuned_tiny
    twin = fake_cpu(cpu_device, model="a twin of this CPU")
    compiled = compile_model(spec, twin, db)
    same = [d for d in compiled.decisions.values() if d.kind == "same-arch"]
    assert same and all(f"measured on device {cpu_device.fingerprint}" in d.detail for d in same)
    strict = compile_model(spec, twin, db, policy="device")
    assert {d.kind for d in strict.decisions.values()} == {"fallback"}
    assert len(same) == len(tuned_tiny[4].best_sec)


def test_cli_compile_reports_tuned_and_fallback(tuned_tiny, tmp_path, capsys, monkeypatch):
    _spec, _db, path, _tasks, summary = tuned_tiny
    monkeypatch.setattr(cli.out, "width", 250)
    out = tmp_path / "tiny.so"
    assert cli.main(["compile", "--model", "tiny", "--db", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    # --layout auto first says which layout each conv got from the records (NCHW was not tuned).
    assert "--layout auto:" in text.splitlines()[0]
    assert "layout plan NCHW8c" in text or "layout plan NCHW16c" in text
    assert f"\n{len(summary.best_sec)} operators tuned on this device, 0 from another device" in text
    assert "with TVM's default lowering" in text and FALLBACK_DESCRIPTION in text
    assert out.stat().st_size > 0
    # The same artifact as `tune -o` writes: its metadata says what was checked, and it runs.
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["verification"]["reference"] == "untuned TVM build" and meta["verification"]["ok"]
    assert meta["latency_ms"] is None and meta["operators"]["tuned"] == len(summary.best_sec)
    np.save(tmp_path / "x.npy", _spec.random_inputs()[0])
    assert cli.main(["run", str(out), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]) == 0
    assert np.load(tmp_path / "y.npy").shape == (1, 10)
