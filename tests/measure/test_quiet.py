"""The node lease that keeps CPU timings and builds apart (``tuner.measure.quiet``).

Real Ray processes on the local cluster: tasks that burn CPU under the shared lease, an actor
that takes the exclusive one, a holder that dies while holding it; and real builds whose
timeout must not count the time they waited for a timing.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest
import ray
import workloads

from tuner.measure import quiet
from tuner.measure.base import MeasureConfig

# Workers cannot import this test module: ship its task and actor by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _until(check, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@ray.remote(num_cpus=0, max_retries=0)
def _work(node_id: str, seconds: float, die: bool = False) -> tuple[float, float]:
    with quiet.cpu_work(node_id):
        start = time.time()
        if die:
            os._exit(1)  # a build process that crashes while it holds the lease
        _burn(seconds)
        return start, time.time()


@ray.remote(num_cpus=0, max_retries=0)
def _staged(node_id: str, stages: int, seconds: float) -> list[tuple[float, float]]:
    """CPU work in stages that lets waiting timings go first between them; when each ran."""
    ran = []
    with quiet.cpu_work(node_id) as work:
        for k in range(stages):
            if k and work.timing_pending():
                work.pause()
            start = time.time()
            _burn(seconds)
            ran.append((start, time.time()))
    return ran


@ray.remote(num_cpus=0)
class _Timer:
    def __init__(self, node_id: str) -> None:
        self.lease = quiet.TimingLease(node_id)

    def time_once(self, seconds: float) -> tuple[float, float, dict]:
        grant = self.lease.acquire()
        start = time.time()
        _burn(seconds)
        end = time.time()
        self.lease.release()
        return start, end, grant


def test_a_timing_waits_for_running_work_and_no_work_starts_during_it(node):
    timer = _Timer.remote(node)
    ray.get(timer.time_once.remote(0.0))  # the actor is up
    lease = quiet.lookup(node)
    first = [_work.remote(node, 4.0)]
    _until(lambda: ray.get(lease.state.remote())["shared"] == 1)  # it holds the lease
    timing = timer.time_once.remote(0.5)
    _until(lambda: (lambda s: s["waiting"] or s["timing"])(ray.get(lease.state.remote())))
    second = [_work.remote(node, 0.2) for _ in range(2)]  # asked while the timing waits or runs
    t_start, t_end, grant = ray.get(timing, timeout=120)
    intervals = ray.get(first + second, timeout=120)
    for start, end in intervals:
        assert end <= t_start or start >= t_end, ("work overlapped the timing", (start, end), (t_start, t_end))
    assert all(end <= t_start for _, end in ray.get(first)), "the timing did not wait for the running work"
    assert grant["shared_waited"] >= 1
    assert all(start >= t_end for start, _ in ray.get(second)), "work started while a timing waited"


def test_a_holder_that_dies_releases_the_lease(node):
    timer = _Timer.remote(node)
    ray.get(timer.time_once.remote(0.0))
    with pytest.raises(ray.exceptions.RayError):
        ray.get(_work.remote(node, 0.0, die=True), timeout=120)
    start = time.monotonic()
    ray.get(timer.time_once.remote(0.0), timeout=60)
    assert time.monotonic() - start < 5.0


def test_builds_waiting_for_a_timing_do_not_time_out(node, make_measurer, task):
    """The build timeout counts the time a build runs, not the time it waited for the node."""
    m = make_measurer(MeasureConfig(build_timeout_s=8, build_start_timeout_s=300))
    m.build(task, [workloads.tiled(task, 8)])  # build workers are up
    held = quiet.TimingLease(node)
    held.acquire()  # this process times for longer than the timeout
    try:
        futures = m.submit(task, [workloads.tiled(task, t) for t in (4, 16)], time_them=False)
        time.sleep(12)
        assert not any(f.done() for f in futures), "a build ran while the node was held for a timing"
    finally:
        held.release()
    for f in futures:
        r = f.result(timeout=120).build
        assert r.ok, r.error_msg


def test_a_timing_waits_for_the_stage_in_progress_not_the_whole_work(node):
    timer = _Timer.remote(node)
    ray.get(timer.time_once.remote(0.0))
    lease = quiet.lookup(node)
    work = _staged.remote(node, 4, 1.0)
    _until(lambda: ray.get(lease.state.remote())["shared"] == 1)
    t_start, t_end, grant = ray.get(timer.time_once.remote(0.3), timeout=120)
    stages = ray.get(work, timeout=120)
    for start, end in stages:
        assert end <= t_start or start >= t_end, ("a stage overlapped the timing", (start, end), (t_start, t_end))
    assert grant["shared_waited"] == 1
    assert any(start >= t_end for start, _ in stages), "the timing waited for the whole work"


def test_a_build_paused_for_a_timing_between_its_stages_does_not_time_out(node, make_measurer, task):
    """A timing asked for while a build compiles runs at the build's next stage, before the
    build ends; the pause, longer than the build timeout, does not count against it."""
    m = make_measurer(MeasureConfig(build_timeout_s=20, build_start_timeout_s=300))
    m.build(task, [workloads.tiled(task, 8)])  # build workers are up
    lease = quiet.lookup(node)
    held = quiet.TimingLease(node)
    [future] = m.submit(task, [workloads.unrolled(task, 32)], time_them=False)  # LLVM compiles for seconds
    _until(lambda: ray.get(lease.state.remote())["shared"] == 1)
    held.acquire()
    try:
        assert not future.done(), "the timing waited for the whole build"
        time.sleep(22)
        assert not future.done(), "the build went on during the timing"
    finally:
        held.release()
    r = future.result(timeout=300).build
    assert r.ok, r.error_msg
    assert r.build_sec < 20


def test_builds_pinned_to_the_cores_a_timing_leaves_free():
    lease = quiet.NodeQuiet()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to keep apart by affinity")
    lease.set_timing_cores(cores[:1])
    grant = asyncio.run(lease.acquire_shared(quiet._request("test")))
    assert grant["cores"] == cores[1:]
    assert lease.state()["shared"] == 0  # a pinned build holds no lease: timings need not wait for it
