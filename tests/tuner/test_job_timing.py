"""Cold timing in a real job: a job that flushes the caches (``tune --timing cold``) stores its
records as cold, and a warm job on the same database neither reuses them nor ranks them with
its own, but starts from their fastest points; lookups prefer the cold ones."""

from __future__ import annotations

import json

from job_tasks import matmul_task

from tuner.db import TuningDatabase
from tuner.graph.tasks import Task
from tuner.job import TuneConfig, TuningJob
from tuner.measure.base import MeasureConfig
from tuner.measure.runner import TimingConfig
from tuner.report.data import job_data, list_jobs


def _run(db: TuningDatabase, device, task: Task, mode: str, **kwargs) -> TuningJob:
    config = TuneConfig(trials=8, batch_size=4, name=mode, measure=MeasureConfig(timing=TimingConfig.of_mode(mode)),
                        measurer="inline")
    job = TuningJob([task], device, db, config, model_name="m", **kwargs)
    job.run()
    return job


def test_cold_job_records_stay_apart_from_warm_ones(cpu_device, tmp_path):
    db = TuningDatabase(f"sqlite:///{tmp_path / 't.db'}")
    task = matmul_task(64)
    cold = _run(db, cpu_device, task, "cold")
    dev = db.device_id(cpu_device)
    assert cold.timing == "cold"
    assert db.measured_points(task.workload_key, dev, "cold") and not db.measured_points(
        task.workload_key, dev, "warm")  # fmt: skip

    # The warm job is seeded: it measures the cold records' fastest points again, for itself,
    # first (each space's fastest heads its queue, and every space gets a batch).
    events: list[dict] = []
    warm = _run(db, cpu_device, task, "warm", on_event=events.append)
    assert warm.reuse == ["new"] and warm.seeded == {0} and warm.done == 8
    [start] = [e for e in events if e["event"] == "job_start"]
    assert "their 8 fastest points per space are measured warm first" in start["tasks"][0]["reuse_rule"]
    cold_points = db.measured_points(task.workload_key, dev, "cold")
    warm_points = db.measured_points(task.workload_key, dev, "warm")
    assert len(cold_points) == len(warm_points) == 8
    for kind in {json.loads(p)["kind"] for p in cold_points}:
        fastest = min((r for r in db.best(task.workload_key, dev, k=16, timing="cold")
                       if json.loads(r.point)["kind"] == kind), key=lambda r: r.mean_sec)  # fmt: skip
        assert fastest.point in warm_points, kind
    assert db.count_records(task.workload_key, dev) == 16

    # Lookups rank the cold records alone; the warm ranking is still there when asked for.
    found = db.lookup(task.workload_key, dev, k=16)
    assert found and {b.row.timing for b in found} == {"cold"} and len(found) <= 8
    assert {r.timing for r in db.best(task.workload_key, dev, k=16, timing="warm")} == {"warm"}

    # Each job's report compares it with records of its own mode only.
    jobs = {j.name: j for j in list_jobs(db)}
    assert (jobs["cold"].timing, jobs["warm"].timing) == ("cold", "warm")
    for mode in ("cold", "warm"):
        [t] = job_data(db, jobs[mode]).tasks
        assert t.best_now == db.best(task.workload_key, dev, timing=mode)[0].mean_sec == t.best_job
    row = db.find_job("cold", dev)
    assert row is not None and json.loads(row.config)["timing"] == "cold"
    db.close()
