"""The time budget leaves room for the batches in flight: no new batch is proposed when the
ones already in flight, at the pace batches have been completing, would end past it."""

from __future__ import annotations

import time

from tuner.job import TuneConfig, TuningJob


def _job(budget_s: float, elapsed_s: float) -> TuningJob:
    # Only the budget's bookkeeping is under test: a job object without tasks or a cluster.
    job = object.__new__(TuningJob)
    job.config = TuneConfig(time_budget_s=budget_s)
    job.elapsed_before = elapsed_s
    job._start = time.perf_counter()
    job._batch_pace_s = None
    job._last_completion = None
    return job


def test_without_a_pace_only_the_clock_counts():
    job = _job(100.0, 90.0)
    assert not job._out_of_time(batches_ahead=3)
    assert _job(100.0, 100.0)._out_of_time()


def test_batches_ahead_count_at_the_measured_pace():
    job = _job(100.0, 80.0)
    job._completed()
    job._last_completion -= 8.0  # the next completion came 8 s after the first
    job._completed()
    assert 7.9 < job._batch_pace_s < 8.5
    assert not job._out_of_time(batches_ahead=2)  # 80 + 16 < 100
    assert job._out_of_time(batches_ahead=3)  # 80 + 24 >= 100: that batch would end past it
    assert not job._out_of_time()


def test_pace_is_a_moving_average():
    job = _job(1000.0, 0.0)
    job._completed()
    for took in (10.0, 10.0, 2.0):
        job._last_completion -= took
        job._completed()
    assert 2.0 < job._batch_pace_s < 10.0
