"""The timing policy and the output check, run in-process on real built candidates."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
import workloads

from tuner.measure.builder import build_candidate
from tuner.measure.results import ErrorClass, relative_spread
from tuner.measure.runner import ArgSpec, CandidateRunner, TimingConfig, compare

CPU = {"kind": "llvm", "num-cores": 1}


@pytest.fixture(scope="module")
def runner(task) -> CandidateRunner:
    ref = build_candidate(tvm.ir.save_json(task.mod), CPU)
    r = CandidateRunner("cpu")
    args = [ArgSpec((64, 64), "float32")] * 3
    assert r.set_reference(task.workload_key, ref.artifact, "main", args).ok
    return r


@pytest.fixture(scope="module")
def good(task) -> bytes:
    return build_candidate(tvm.ir.save_json(workloads.tiled(task, 16)), CPU).artifact


def test_spread_is_iqr_over_median():
    assert relative_spread([1.0]) == 0.0
    assert relative_spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert relative_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0 / 3.0)


def test_compare_tolerance_by_dtype():
    want = np.linspace(-10, 10, 100).astype("float32")
    assert compare(want + np.float32(1e-4), want) is None  # reordered float32 sums err this much
    assert compare(want + np.float32(0.1), want) is not None
    half = want.astype("float16")
    assert compare(half + np.float16(0.05), half) is None
    assert compare(np.arange(4, dtype="int32") + 1, np.arange(4, dtype="int32")) == "4 elements differ (by up to 1)"
    # Requantized 8-bit outputs: a few values one step apart at rounding ties pass (an
    # ulp of float arithmetic), more of them, or any by 2, do not.
    q = np.random.default_rng(0).integers(0, 250, 5000).astype("uint8")
    ties = q.copy()
    ties[:3] += 1
    assert compare(ties, q) is None
    ties[:50] += 1
    assert compare(ties, q) == "50 elements differ (by up to 2)"
    spread = q.copy()
    spread[:10] += 1
    assert compare(spread, q) == "10 elements differ (by up to 1)"
    assert compare(np.arange(4, dtype="int32") + 0, np.arange(4, dtype="int32")) is None
    assert compare(np.full(3, np.nan, "float32"), np.zeros(3, "float32")) is not None


def test_every_repeat_kept_and_noisy_results_remeasured(runner, task, good):
    # max_spread=-1 makes every round count as noisy: all rounds must be taken and kept.
    timing = TimingConfig(repeat=3, min_repeat_ms=1, max_spread=-1.0, max_remeasure=2)
    r = runner.measure(task.workload_key, good, "main", timing)
    assert r.ok, r.error_msg
    assert r.remeasured == 2
    assert len(r.run_secs) == 9
    assert all(s > 0 for s in r.run_secs)
    quiet = runner.measure(task.workload_key, good, "main", TimingConfig(repeat=4, max_spread=10.0))
    assert quiet.remeasured == 0 and len(quiet.run_secs) == 4


def test_slow_candidate_gets_fewer_repeats_within_the_timing_budget(runner, task, good):
    """The first candidate of a task has no best to stop it early; the budget bounds it."""
    noisy = TimingConfig(repeat=5, min_repeat_ms=1, max_spread=-1.0, max_remeasure=2, max_timing_s=1e-9)
    r = runner.measure(task.workload_key, good, "main", noisy)
    assert r.ok and r.run_secs and len(r.run_secs) == 1 and r.remeasured == 0
    unbounded = runner.measure(task.workload_key, good, "main",
                               TimingConfig(repeat=5, min_repeat_ms=1, max_spread=-1.0, max_remeasure=2,
                                            max_timing_s=0))  # fmt: skip
    assert len(unbounded.run_secs) == 15 and unbounded.remeasured == 2


def test_cache_flush_times_each_call_cold(runner, task, good):
    warm = runner.measure(task.workload_key, good, "main", TimingConfig(repeat=5, min_repeat_ms=5))
    cold = runner.measure(task.workload_key, good, "main", TimingConfig(repeat=5, flush_cache=True))
    assert warm.ok and cold.ok
    assert len(cold.run_secs) >= 5


def test_hopeless_candidate_stopped_early_with_probe_only(runner, task, good):
    timing = TimingConfig(repeat=5, probe=2, hopeless_factor=2.0)
    slow = runner.measure(task.workload_key, good, "main", timing, best_sec=1e-9)
    assert slow.ok and slow.early_stopped and len(slow.run_secs) == 2
    fine = runner.measure(task.workload_key, good, "main", timing, best_sec=10.0)
    assert fine.ok and not fine.early_stopped and len(fine.run_secs) >= 5


@pytest.mark.slow
def test_probe_calls_count_as_repeats_when_each_is_one(runner, task, good):
    # No remeasuring however noisy the runs (a microsecond call on a loaded 2-core machine
    # has measured an IQR over 10x its median): this is about counting the probe.
    reused = TimingConfig(repeat=5, probe=3, hopeless_factor=4.0, min_repeat_ms=0, max_spread=float("inf"))
    r = runner.measure(task.workload_key, good, "main", reused, best_sec=10.0)
    assert r.ok and not r.early_stopped and len(r.run_secs) == 5
    # A 64^3 matmul call is far shorter than 1 s: the probe is no repeat of that kind.
    dropped = TimingConfig(repeat=4, probe=3, hopeless_factor=4.0, min_repeat_ms=1000, max_spread=float("inf"))
    r = runner.measure(task.workload_key, good, "main", dropped, best_sec=10.0)
    assert r.ok and not r.early_stopped and len(r.run_secs) == 4
    assert min(r.run_secs) > 1e-6


def test_noisy_candidate_remeasured_only_while_it_may_be_the_best(runner, task, good):
    # Every round counts as noisy; no probe, so nothing stops the candidate early.
    noisy = TimingConfig(repeat=3, min_repeat_ms=1, max_spread=-1.0, max_remeasure=2, hopeless_factor=0.0)
    behind = runner.measure(task.workload_key, good, "main", noisy, best_sec=1e-9)
    assert behind.ok and not behind.early_stopped
    assert behind.remeasured == 0 and len(behind.run_secs) == 3
    contender = runner.measure(task.workload_key, good, "main", noisy, best_sec=10.0)
    assert contender.remeasured == 2 and len(contender.run_secs) == 9
    always = runner.measure(task.workload_key, good, "main", dataclasses.replace(noisy, contender_factor=0.0),
                            best_sec=1e-9)  # fmt: skip
    assert always.remeasured == 2


def test_wrong_answer_is_an_error_never_a_timing(runner, task):
    wrong = build_candidate(tvm.ir.save_json(workloads.wrong_result()), CPU).artifact
    r = runner.measure(task.workload_key, wrong, "main", TimingConfig())
    assert r.error_class is ErrorClass.WRONG_RESULT
    assert not r.ok and r.run_secs == []


def test_build_error_is_data(task):
    b = build_candidate(tvm.ir.save_json(workloads.build_error(task)), CPU)
    assert b.error_class is ErrorClass.BUILD_ERROR and b.artifact is None
