"""The Ray measurer on a real local cluster: builds, verified timings, faults as data."""

from __future__ import annotations

import time

import pytest
import workloads

from tuner.errors import UserInputError
from tuner.measure.base import MeasureConfig, device_resource
from tuner.measure.ray_measure import env_address, worker_command
from tuner.measure.results import ErrorClass
from tuner.measure.runner import TimingConfig

FAST = TimingConfig(repeat=3, min_repeat_ms=5, max_remeasure=1)


def test_candidates_built_checked_and_timed_on_runtime_only_actor(make_measurer, task):
    m = make_measurer(MeasureConfig(build_timeout_s=60, run_timeout_s=30, timing=FAST))
    info = m.actor_info()
    # The device actor imports TVM's runtime only: no compiler is needed where timing runs.
    assert info["runtime_only"] and not info["compiler_loaded"]
    results = m.measure(task, [workloads.tiled(task, t) for t in (8, 16, 32)])
    for r in results:
        assert r.error_class is None, r.error_msg
        assert r.build.ok and r.build.size > 0 and r.build.artifact is None  # bytes stayed in Ray
        assert len(r.run.run_secs) >= 3 and r.run.median > 0
        assert r.run.node_id == info["node_id"]
    assert m.stats.timed == 3 and 0.0 <= m.stats.device_idle_fraction < 1.0
    assert m.stats.device_busy_s > 0
    # Calls arrive on the actor's many threads; checks and timings all run on one, so TVM's
    # per-thread CPU pool exists once (not one pool of spinning workers per call thread).
    assert m.actor_info()["timing_threads"] == 1


def test_faults_become_error_classes_and_the_batch_completes(make_measurer, task):
    """Crash, hang, wrong answer, build error and build timeout in one batch with good ones.

    The slow build holds a CPU of the device's node for its whole timeout: no timing may run
    beside it, so the good candidates' timings wait until it is cancelled, and say so.
    """
    # A restarted actor takes tens of seconds to come back on a loaded 2-core machine. One
    # candidate per timing call: in a batch, only the first call reports the wait, and that
    # may be the crash or the hang, whose results never come back.
    config = MeasureConfig(build_timeout_s=25, run_timeout_s=4, device_wait_s=150, timing=FAST, timing_batch=1)
    m = make_measurer(config)
    batch = {
        "slow_build": workloads.slow_build(task),
        "good1": workloads.tiled(task, 8),
        "crash": workloads.crash(),
        "good2": workloads.tiled(task, 16),
        "hang": workloads.hang(),
        "good3": workloads.tiled(task, 32),
        "wrong": workloads.wrong_result(),
        "build_error": workloads.build_error(task),
        "good4": workloads.tiled(task, 4, vectorize=False),
    }
    start = time.monotonic()
    results = dict(zip(batch, m.measure(task, list(batch.values())), strict=True))
    assert time.monotonic() - start < 400
    expected = {
        "slow_build": ErrorClass.BUILD_TIMEOUT, "crash": ErrorClass.RUN_CRASH, "hang": ErrorClass.RUN_TIMEOUT,
        "wrong": ErrorClass.WRONG_RESULT, "build_error": ErrorClass.BUILD_ERROR,
    }  # fmt: skip
    for name, r in results.items():
        assert r.error_class == expected.get(name), (name, r.error_msg)
        if name.startswith("good"):
            assert r.run.ok and r.run.median > 0
            assert r.run.device_fingerprint == m.device.fingerprint
    waited = [r.run for n, r in results.items() if r.run.builds_waited]
    assert waited, "no timing waited for the slow build: a timing shared its cores with a build"
    assert max(run.quiet_wait_s for run in waited) > 1.0
    # The actor came back after the crash and the hang and still times.
    after = m.measure(task, [workloads.tiled(task, 8)])[0]
    assert after.error_class is None, after.error_msg


def test_missing_device_resource_names_the_ray_start_command(ray_cluster):
    from tuner.device import parse_device
    from tuner.measure.ray_measure import RayMeasurer

    gpu = parse_device("cuda:0", target_arch="sm_90")
    assert device_resource(gpu) == "nightshift_cuda_sm_90"
    with pytest.raises(UserInputError, match="ray start --address"):
        RayMeasurer(gpu)
    assert "--num-gpus 1" in worker_command(gpu) and '"nightshift_cuda_sm_90": 1' in worker_command(gpu)


@pytest.mark.parametrize("address", ["ray://head:10001", "http://head:8265"])
def test_ray_address_that_ray_init_cannot_join_says_what_to_pass(monkeypatch, address):
    monkeypatch.setenv("RAY_ADDRESS", address)
    with pytest.raises(UserInputError, match="pass --ray-address http://head:8265 to submit the job"):
        env_address()
    monkeypatch.setenv("RAY_ADDRESS", " ")
    assert env_address() is None


def test_local_cluster_offers_the_host_cpu_resource(ray_cluster, cpu_device):
    import ray

    assert ray.cluster_resources().get(device_resource(cpu_device)) == 1


def test_loaded_candidates_are_unloaded_with_their_module(task, tmp_path):
    """A device actor loads one library per candidate for as long as a job runs: each must go
    when its module does, or ~13,000 candidates exhaust the kernel's memory maps
    (vm.max_map_count) and every later load fails."""
    import gc
    from pathlib import Path

    import numpy as np
    import tvm

    from tuner.measure.runner import _load

    path = tmp_path / "candidate.so"
    tvm.build(workloads.tiled(task, 8), target="llvm").export_library(str(path))
    artifact = path.read_bytes()
    args = [tvm.runtime.tensor(np.ones((workloads.N, workloads.N), "float32")) for _ in range(3)]

    def maps() -> int:
        return len(Path("/proc/self/maps").read_text().splitlines())

    _load(artifact)["main"](*args)  # the first load maps what every later one shares
    gc.collect()
    before = maps()
    for _ in range(50):
        lib = _load(artifact)
        lib["main"](*args)
        del lib
    gc.collect()
    # Five maps a library when they leak (250 here); a few of Python's own may come and go.
    assert maps() - before < 25
    assert float(args[2].numpy()[0, 0]) == workloads.N  # the last candidate ran
