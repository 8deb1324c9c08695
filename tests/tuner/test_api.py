"""The Python API (``tuner.tune``, ``tuner.load``): light to import, the real job end to end,
errors raised as exceptions, and a Ray it did not start left running."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import tuner
from tuner.errors import UnknownModelError, UserInputError


def test_import_tuner_is_light():
    code = ("import sys, tuner; assert tuner.__version__; "
            "print(sorted(m for m in ('tvm', 'torch', 'ray', 'tuner.api') if m in sys.modules))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert {"tune", "compile_model", "load"} <= set(dir(tuner))
    with pytest.raises(AttributeError):
        tuner.no_such_thing  # noqa: B018


def test_unknown_model_raises_before_any_work(tmp_path):
    with pytest.raises(UnknownModelError, match="tiny"):
        tuner.tune("no-such-model", db=tmp_path / "t.db", measurer="inline", progress=False)
    assert not (tmp_path / "t.db").exists()
    with pytest.raises(UserInputError, match="ray_address"):
        tuner.tune("tiny", db=tmp_path / "t.db", ray_address="http://head:8265", progress=False)
    with pytest.raises(UserInputError, match="time_budget"):
        tuner.tune("tiny", db=tmp_path / "t.db", time_budget="soon", progress=False)


@pytest.mark.slow
def test_tune_then_load_and_run(tmp_path):
    """A real job (inline measurer, 4 trials), its artifact loaded and run beside TVM's untuned build."""
    from tuner.compile import compile_model, run_model
    from tuner.device import parse_device
    from tuner.frontends import load_model

    result = tuner.tune("tiny", trials=4, trials_per_batch=4, measurer="inline", rerank_top=0,
                        db=f"sqlite:///{tmp_path / 't.db'}", output=tmp_path / "tiny.so", job="api",
                        progress=False)  # fmt: skip
    assert isinstance(result, tuner.TuneResult)
    assert result.job_name == "api" and result.job_id == 1 and result.state == "done" and result.trials == 4
    assert result.ok and result.artifact == tmp_path / "tiny.so" and result.metadata == tmp_path / "tiny.json"
    assert result.latency_ms > 0 and result.baseline_latency_ms > 0 and result.speedup > 0
    # One ratio direction: tuned / baseline, lower is better; speedup stays its inverse.
    assert result.ratio_to_baseline == pytest.approx(1 / result.speedup)
    assert result.baseline in ("fallback build (0 trials)", "untuned TVM build") and result.untuned_latency_ms > 0
    assert (result.warning is not None) == (result.ratio_to_baseline > 1)
    assert result.max_error is not None and result.max_error <= 1e-2

    art = tuner.load(result.artifact)
    (x,) = tuner.random_inputs(art, seed=3)
    assert x.shape == tuple(art.inputs[0]["shape"]) and str(x.dtype) == art.inputs[0]["dtype"]
    (y,) = art.run([x])
    device = parse_device("cpu")
    (ref,), _ = run_model(compile_model(load_model("tiny"), device, None), device, [x], budget_s=0.05)
    assert np.max(np.abs(ref - y)) <= 1e-2 * max(float(np.max(np.abs(ref))), 1e-6)

    stats = tuner.latency(art, rounds=5)
    assert stats.runs == 5 and 0 < stats.min_ms <= stats.p50_ms <= stats.p90_ms <= stats.p99_ms <= stats.max_ms
    assert stats.throughput > 0


@pytest.mark.parametrize("running", [True, False])
def test_ray_is_shut_down_only_if_the_job_started_it(monkeypatch, running):
    """A Ray already running in the process (a notebook's ray.init()) is left running."""
    import ray

    from tuner.app.model import ModelOptions
    from tuner.app.tune import PreparedJob, TuneOptions, run_job

    calls: list[str] = []

    def connect(address=None):
        calls.append("connect")
        return not running  # True: it started a local cluster, which its caller owns

    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr("tuner.measure.ray_measure.connect", connect)
    monkeypatch.setattr("tuner.job.tune_tasks", lambda *a, **k: calls.append("tune") or "summary")
    job = PreparedJob(options=TuneOptions(model=ModelOptions(model="tiny")),
                      loaded=SimpleNamespace(spec=SimpleNamespace(name="tiny"), device="cpu"),
                      db=None, tasks=[], config=None)  # type: ignore[arg-type]
    assert run_job(job) == "summary"
    assert calls == ["connect", "tune"] + ([] if running else ["shutdown"])


def test_run_random_input_stats():
    from tuner.app.run import LatencyStats, random_inputs

    meta = {"inputs": [{"name": "ids", "shape": [2, 8], "dtype": "int64", "bounds": [0, 30]},
                       {"name": "x", "shape": [3], "dtype": "float32"}]}  # fmt: skip
    ids, x = random_inputs(meta)
    assert ids.dtype == np.int64 and ids.shape == (2, 8) and ids.min() >= 0 and ids.max() < 30
    assert x.dtype == np.float32 and np.all(np.abs(x) <= 1)
    np.testing.assert_array_equal(random_inputs(meta)[0], ids)  # deterministic
    s = LatencyStats.of([0.001, 0.002, 0.003, 0.004])
    assert s.p50_ms == pytest.approx(2.5) and s.mean_ms == pytest.approx(2.5) and s.throughput == pytest.approx(400)
    assert "p99" in s.describe() and "inferences/s" in s.describe()
    assert s.median_ms == s.p50_ms and s.iqr_ms == pytest.approx(1.5) and s.spread == pytest.approx(0.6)
    assert s.describe().startswith("latency 2.500 ms (median of 4 runs, IQR 1.750-3.250 ms = 60% of the median; ")
    assert s.to_json()["median_ms"] == pytest.approx(2.5) and "median of 4 runs" in s.to_json()["method"]
    with pytest.raises(ValueError):
        LatencyStats.of([])
