"""The tuning job: tasks -> proposals -> Ray builds and timings -> database and cost model."""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
from tvm.s_tir import meta_schedule as ms

import cost_models
import search_spaces
from tuner.db import NewRecord, TuningDatabase
from tuner.device import Device
from tuner.errors import UserInputError
from tuner.measure.ray_measure import MeasureConfig, RayMeasurer
from tuner.search import ModelGuidedSampler, TaskScheduler
from tuner.tasks import Task

logger = logging.getLogger(__name__)

# Batches in flight: one measured while the next is proposed.
PIPELINE_DEPTH = 2


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """Options of one tuning job."""

    trials: int
    batch_size: int = 16
    seed: int = 0
    measure: MeasureConfig = field(default_factory=MeasureConfig)

    def __post_init__(self) -> None:
        if self.trials <= 0:
            raise UserInputError(f"--trials must be a positive integer, got {self.trials}")
        if self.batch_size <= 0:
            raise UserInputError(f"--batch must be a positive integer, got {self.batch_size}")


@dataclass
class Progress:
    """What the job reports after every batch."""

    trials_done: int
    trials_total: int
    task_name: str
    tasks_done: int
    num_tasks: int
    errors: int
    elapsed_s: float
    best_gflops: dict[str, float]


@dataclass(frozen=True)
class TuneSummary:
    """Outcome of a job."""

    job_id: int
    trials: int
    errors: dict[str, int]
    best_sec: dict[str, float]
    elapsed_s: float
    device_idle_fraction: float | None = None


@dataclass
class _Batch:
    """Candidates of one task proposed together and measured while the next batch is proposed."""

    index: int
    points: list
    schedules: list
    feats: np.ndarray
    futures: list


def tune_tasks(
    tasks: list[Task],
    device: Device,
    db: TuningDatabase,
    config: TuneConfig,
    *,
    model_name: str,
    on_progress: Callable[[Progress], None] | None = None,
) -> TuneSummary:
    """Tune ``tasks`` on ``device`` with ``config.trials`` measurements in all.

    Proposing, building and timing overlap: while one batch is built and timed on the
    cluster, the next is proposed (``PIPELINE_DEPTH`` batches in flight). Every measurement,
    failed ones included, goes into ``db`` as its batch completes, so a killed job loses at
    most the batches in flight. The Ray cluster must already be connected.
    """
    start = time.perf_counter()
    target = device.target
    device_id = db.device_id(device)
    for t in tasks:
        db.workload_id(t.workload_key, t.name, t.mod, t.flops)
    job_id = db.start_job(model_name, device_id, {"device": device.name} | _jsonable(asdict(config)), config.trials)
    measurer = RayMeasurer(device, config.measure)
    model = cost_models.create("xgb", seed=config.seed)
    sampler = ModelGuidedSampler(seed=config.seed)
    scheduler = TaskScheduler(tasks)
    spaces: dict[int, search_spaces.SearchSpace] = {}
    seen: dict[int, set[str]] = {i: set() for i in range(len(tasks))}
    errors: dict[str, int] = {}
    done = submitted = 0
    dead: set[int] = set()
    inflight: deque[_Batch] = deque()
    try:
        while True:
            while len(inflight) < PIPELINE_DEPTH and submitted < config.trials and len(dead) < len(tasks):
                batch = _propose(tasks, target, config, measurer, model, sampler, scheduler, spaces, seen, dead,
                                 inflight, config.trials - submitted)  # fmt: skip
                if batch is None:
                    continue
                inflight.append(batch)
                submitted += len(batch.points)
            if not inflight:
                break
            batch = inflight.popleft()
            i, task = batch.index, tasks[batch.index]
            results = [f.result() for f in batch.futures]
            if all((m.run.error_msg or "").startswith("reference:") for m in results):
                logger.warning("task %s has no reference output (%s); skipped", task.name, results[0].error_msg)
                dead.add(i)
            records, gflops = [], np.zeros(len(batch.points))
            args_info = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
            best = None
            for k, (p, s, m) in enumerate(zip(batch.points, batch.schedules, results, strict=True)):
                r = m.run
                rec = ms.database.TuningRecord(s.trace, ms.database.Workload(task.mod),
                                               r.run_secs or None, target, args_info)
                error = m.error_class
                msg = m.error_msg
                if error is None and r.early_stopped:
                    msg = f"stopped early: at least {min(r.run_secs):.3g} s (probe only)"
                records.append(NewRecord(
                    workload_key=task.workload_key, point=p.to_json(),
                    record_json=json.dumps(rec.as_json()), run_secs=r.run_secs,
                    error_class=str(error) if error else None, error_msg=msg,
                    build_sec=m.build.build_sec,
                ))  # fmt: skip
                if error:
                    errors[str(error)] = errors.get(str(error), 0) + 1
                    continue
                sec = float(np.median(r.run_secs))
                gflops[k] = task.flops / sec / 1e9 if task.flops else 1.0 / sec
                if not r.early_stopped:
                    best = sec if best is None else min(best, sec)
            db.add_records(device_id, job_id, records)
            model.update(batch.feats, gflops, np.full(len(batch.points), i))
            scheduler.update(i, len(batch.points), best)
            done += len(batch.points)
            db.update_job(job_id, trials_done=done)
            if on_progress is not None:
                on_progress(Progress(
                    trials_done=done, trials_total=config.trials, task_name=task.name,
                    tasks_done=sum(1 for n in scheduler.trials if n), num_tasks=len(tasks),
                    errors=sum(errors.values()), elapsed_s=time.perf_counter() - start,
                    best_gflops={tasks[j].name: tasks[j].flops / s / 1e9
                                 for j, s in enumerate(scheduler.best_sec) if s},
                ))  # fmt: skip
    except BaseException:
        db.update_job(job_id, state="failed")
        raise
    finally:
        stats = measurer.stats
        measurer.close()
    logger.info("device idle %.0f%% of %.0f s; %.1f s of builds", 100 * stats.device_idle_fraction, stats.wall_s,
                stats.build_s)
    db.update_job(job_id, trials_done=done, state="done")
    if model.num_samples:
        db.save_cost_model(device_id, "xgb", model.save(), model.num_samples)
    best_sec = {tasks[j].workload_key: s for j, s in enumerate(scheduler.best_sec) if s}
    return TuneSummary(job_id, done, errors, best_sec, time.perf_counter() - start, stats.device_idle_fraction)


def _propose(tasks, target, config, measurer, model, sampler, scheduler, spaces, seen, dead, inflight,
             budget) -> _Batch | None:  # fmt: skip
    """Pick a task, propose its next batch and submit it; None if the task had nothing to give."""
    busy = {b.index for b in inflight}
    # Every task gets a first batch before any gets a second (the scheduler's rule); tasks
    # whose first batch is still in flight are passed over so the pipeline stays full.
    unvisited = [j for j, n in enumerate(scheduler.trials) if n == 0 and j not in busy and j not in dead]
    i = unvisited[0] if unvisited else scheduler.next_task()
    if i in dead:
        scheduler.update(i, 10**9, None)
        return None
    task = tasks[i]
    if i not in spaces:
        spaces[i] = search_spaces.create(task.mod, target, seed=config.seed + 1)
    size = min(config.batch_size, budget)
    if scheduler.trials[i] == 0:
        # First visit: a budget too small for a full batch per task is spread so
        # that every task gets measured schedules before any gets a second batch.
        size = min(size, max(2, config.trials // len(tasks)))
    # The search runs on the driver; let the device actor stop it while it times on this node.
    with measurer.pausable():
        points, schedules, feats = sampler.propose(spaces[i], task.mod, target, model, size, seen[i])
    if not points:
        logger.info("task %s: space exhausted", task.name)
        dead.add(i)
        return None
    seen[i].update(p.to_json() for p in points)
    futures = measurer.submit(task, [s.mod for s in schedules])
    return _Batch(i, points, schedules, feats, futures)


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))
