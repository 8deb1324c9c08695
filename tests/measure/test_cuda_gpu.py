"""CUDA measured on a GPU, on the code path a Ray GPU worker uses. Run where a GPU is:
``pytest -m gpu tests/measure/test_cuda_gpu.py`` (skipped elsewhere)."""

from __future__ import annotations

import pytest

from tuner.cuda_runtime import gpu_identity
from tuner.measure.results import ErrorClass

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_identity(0) is None, reason="needs an NVIDIA GPU with TVM's CUDA runtime"),
]


@pytest.fixture(scope="module")
def gpu_device():
    from tuner.device import parse_device

    return parse_device("cuda:0")


def _task(mod):
    from tuner.graph.keys import workload_key
    from tuner.graph.tasks import Task

    return Task("gpu", mod, 1, 1.0, workload_key(mod))


def test_candidates_time_on_the_gpu_against_the_gpu_reference(ray_cluster, gpu_device):
    from test_cuda_build import _conv, _dense, gpu_candidate

    from tuner.measure.ray_measure import RayMeasurer

    with RayMeasurer(gpu_device) as m:
        info = m.actor_info()
        assert info["runtime_only"] and not info["compiler_loaded"]
        for make in (_conv, _dense):
            task = _task(make())
            results = m.measure(task, [gpu_candidate(task.mod, threads=t) for t in (32, 128)])
            for r in results:
                assert r.error_class is None, r.error_msg
                assert 0 < r.run.median < 0.01  # CUDA-event timings of a tiny kernel


def test_illegal_address_restarts_the_actor_and_is_recorded_once(ray_cluster, gpu_device):
    from test_cuda_build import _dense, gpu_candidate, out_of_bounds

    from tuner.measure.base import MeasureConfig
    from tuner.measure.ray_measure import RayMeasurer

    task = _task(_dense())
    good = gpu_candidate(task.mod)
    with RayMeasurer(gpu_device, MeasureConfig(device_wait_s=120)) as m:
        results = m.measure(task, [good, out_of_bounds(), good, good])
    classes = [r.error_class for r in results]
    assert classes == [None, ErrorClass.RUN_CRASH, None, None], [(r.error_class, r.error_msg) for r in results]


def test_gpu_identity_reaches_the_fingerprint(gpu_device):
    info = gpu_device.description
    assert info["gpu"] and info["arch"].startswith("sm_") and info["cuda_runtime"].startswith("13.")
    assert info.get("cuda_driver")
