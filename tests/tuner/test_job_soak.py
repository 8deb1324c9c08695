"""Small jobs back to back on one Ray cluster, their builds failing at random while they hold
their node's lease (raising, or running past the build timeout until the driver kills them):
no job hangs, each ends within its time budget, and the node's lease is free at the end
(issue 65, item 0)."""

from __future__ import annotations

import sys
import time
import zlib
from concurrent.futures import Future

import pytest
import ray
import tvm
from job_tasks import matmul_task

from tuner.db import TuningDatabase
from tuner.job import TuneConfig, TuningJob
from tuner.measure import quiet, ray_measure
from tuner.measure.base import MeasureConfig
from tuner.measure.builder import build_task
from tuner.measure.results import BuildResult, ErrorClass, Measurement, RunResult
from tuner.measure.runner import TimingConfig

# Workers cannot import this test module: ship the flaky build by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

JOBS = 20
BUDGET_S = 30.0
RAISE, HANG = 0.25, 0.02  # shares of builds that raise / outlive the build timeout


def _flaky(spared: set[str]):
    """``build_task`` failing for a share of candidates (the same ones on every run) after it
    has taken its node's lease, as a build that crashes in TVM or never ends would; the
    modules in ``spared`` (the tasks' references, without which a job stops at once) build."""

    def build(mod_json: str, target_config: dict):
        fate = zlib.crc32(mod_json.encode()) / 2**32
        if mod_json in spared or fate >= RAISE + HANG:
            yield from build_task(mod_json, target_config)
            return
        node_id = ray.get_runtime_context().get_node_id()
        with quiet.cpu_work(node_id):
            yield node_id  # started: the driver's build timeout counts from here
            if fate < RAISE:
                raise RuntimeError("injected build failure")
            time.sleep(3600)

    return build


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_jobs_back_to_back_with_failing_builds_never_hang(ray_cluster, cpu_device, tmp_path, monkeypatch):
    tasks = [matmul_task(n) for n in (16, 24, 32)]
    monkeypatch.setattr(ray_measure, "build_task", _flaky({tvm.ir.save_json(t.mod) for t in tasks}))
    db = TuningDatabase(f"sqlite:///{tmp_path / 'soak.db'}")
    measure = MeasureConfig(build_timeout_s=3.0, run_timeout_s=10.0, build_start_timeout_s=60.0,
                            timing=TimingConfig(repeat=3, min_repeat_ms=5, max_remeasure=1))  # fmt: skip

    def make_job(k: int, trials: int) -> TuningJob:
        config = TuneConfig(trials=trials, batch_size=2, seed=k, name=f"soak{k}", time_budget_s=BUDGET_S,
                            measure=measure, spool_dir=tmp_path)  # fmt: skip
        return TuningJob([tasks[k % len(tasks)]], cpu_device, db, config, model_name="m")

    make_job(JOBS, 2).run()  # starts the device actor and the build workers, which the budgets leave out
    errors: dict[str, int] = {}
    ok = 0
    for k in range(JOBS):
        job = make_job(k, 4)
        start = time.monotonic()
        summary = job.run()
        took = time.monotonic() - start
        assert summary.state == "done", (k, summary.reason)
        assert took < BUDGET_S, f"job {k} took {took:.0f} s"
        for cls, n in job.errors.items():
            errors[cls] = errors.get(cls, 0) + n
        ok += job._run_ok
    assert errors.get(ErrorClass.BUILD_ERROR, 0) > 0, errors  # the injected failures happened
    assert ok > JOBS, ("too few candidates timed", ok, errors)
    node_id = ray.get_runtime_context().get_node_id()
    state = ray.get(quiet.lookup(node_id).state.remote(), timeout=30)
    assert state["shared"] == 0 and not state["timing"] and not state["waiting"], state
    db.close()


def test_a_candidate_without_a_result_is_lost_and_the_job_goes_on(cpu_device, tmp_path):
    # A future no measurer resolves (a lost call, an engine bug) beside one resolved.
    measure = MeasureConfig(build_start_timeout_s=0.2, build_timeout_s=0.2, lease_wait_s=0.2, run_timeout_s=0.2,
                            result_margin_s=0.2)  # fmt: skip
    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    job = TuningJob([matmul_task(16)], cpu_device, db, TuneConfig(trials=2, measure=measure), model_name="m")
    done, never = Future(), Future()
    done.set_result(Measurement(BuildResult(None, 0.1), RunResult([1e-3])))
    start = time.monotonic()
    got = job._await([never, done])
    assert time.monotonic() - start < 5 * measure.candidate_wait()
    assert got[0].error_class == ErrorClass.LOST and "no result within" in (got[0].error_msg or "")
    assert got[1] is done.result()
    assert not never.done()  # the measurer's future is left to the measurer
    db.close()
