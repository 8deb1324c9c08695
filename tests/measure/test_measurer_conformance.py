"""The contract of every measurer (``tuner.measure.base.Measurer``), one suite for all of them:
adding a measurer to ``MEASURERS`` adds it here."""

from __future__ import annotations

import pytest
import workloads

from tuner import measure
from tuner.errors import UserInputError
from tuner.measure import base
from tuner.measure.results import ErrorClass
from tuner.measure.runner import TimingConfig

FAST = TimingConfig(repeat=3, min_repeat_ms=5, max_remeasure=1)


@pytest.fixture(params=base.MEASURERS)
def measurer(request, cpu_device):
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    m = measure.create(request.param, cpu_device, base.MeasureConfig(build_timeout_s=60, run_timeout_s=30, timing=FAST))
    yield m
    m.close()


def test_good_candidates_are_built_checked_and_timed(measurer, task):
    assert isinstance(measurer, base.Measurer)
    futures = measurer.submit(task, [workloads.tiled(task, t) for t in (8, 16)])
    results = [f.result(timeout=300) for f in futures]
    for r in results:
        assert r.error_class is None, r.error_msg
        assert r.build.ok and len(r.run.run_secs) >= 3 and r.run.median > 0
        assert r.run.device_fingerprint == measurer.device.fingerprint
    assert measurer.stats.timed == 2 and measurer.stats.candidates == 2
    assert measurer.alive()


def test_faults_are_data_in_order(measurer, task):
    batch = [workloads.build_error(task), workloads.wrong_result(), workloads.tiled(task, 8)]
    results = [f.result(timeout=300) for f in measurer.submit(task, batch)]
    assert [r.error_class for r in results] == [ErrorClass.BUILD_ERROR, ErrorClass.WRONG_RESULT, None]
    assert measurer.stats.errors == {str(ErrorClass.BUILD_ERROR): 1, str(ErrorClass.WRONG_RESULT): 1}


def test_build_only_and_the_search_kept_apart_from_timings(measurer, task):
    with measurer.cpu_work():  # the driver's search: no timing of this measurer runs meanwhile
        futures = measurer.submit(task, [workloads.tiled(task, 8)], time_them=False)
    r = futures[0].result(timeout=300)
    assert r.build.ok and r.error_class is None and not r.run.run_secs
    lease = measurer.timing_lease()  # both time on this process's node
    assert lease is not None
    lease.acquire()
    lease.release()


def test_create_takes_an_instance_and_refuses_unknown_names(measurer, cpu_device):
    assert measure.create(measurer, cpu_device) is measurer
    with pytest.raises(UserInputError, match="unknown measurer 'local'"):
        measure.create("local", cpu_device)  # type: ignore[arg-type]


def test_the_timing_side_imports_with_tvms_runtime_alone():
    """A device actor runs under TVM's runtime without the compiler (``TVM_USE_RUNTIME_LIB=1``):
    the modules it imports, the device layer included, must not pull in the compiler side."""
    import os
    import subprocess
    import sys

    code = ("from tuner.measure.runner import CandidateRunner\nimport tuner.device, tuner.measure.device_actor\n"
            "from tvm import base\nassert base._RUNTIME_ONLY\nprint(CandidateRunner('cpu').info()['runtime_only'])")
    done = subprocess.run([sys.executable, "-c", code], env=os.environ | {"TVM_USE_RUNTIME_LIB": "1"},
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
