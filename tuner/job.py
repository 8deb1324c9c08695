"""The tuning job: tasks -> proposals -> Ray builds and timings -> database and cost model.

:class:`TuningJob` holds the whole loop state (tasks, their spaces and strategies, the cost
model, the task scheduler, the batches in flight, errors and counters); ``tune_tasks`` runs one.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tvm.s_tir import meta_schedule as ms

import cost_models
import search_spaces
from tuner import search
from tuner.db import NewRecord, TuningDatabase
from tuner.db.database import measured_results
from tuner.device import Device
from tuner.errors import UserInputError
from tuner.measure.ray_measure import MeasureConfig, RayMeasurer
from tuner.search import Candidate, NoTaskAvailable, Result, SearchStrategy, SpaceBandit, TaskScheduler
from tuner.tasks import Task, program_hash

logger = logging.getLogger(__name__)

# Batches in flight: one measured while the next is proposed.
PIPELINE_DEPTH = 2
# Newest records the cost model is pre-trained on at the start of a job: rebuilding a
# record's features costs ~10-20 ms on a 2-core machine.
PRETRAIN_RECORDS = 2_000
# Proposals per batch when candidates turn out to be programs measured already.
_PROPOSE_ROUNDS = 3


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """Options of one tuning job."""

    trials: int
    batch_size: int = 16
    seed: int = 0
    strategy: str = search.DEFAULT_STRATEGY
    measure: MeasureConfig = field(default_factory=MeasureConfig)

    def __post_init__(self) -> None:
        if self.trials <= 0:
            raise UserInputError(f"--trials must be a positive integer, got {self.trials}")
        if self.batch_size <= 0:
            raise UserInputError(f"--batch must be a positive integer, got {self.batch_size}")
        if self.strategy not in search.strategies():
            raise UserInputError(f"--strategy must be one of {', '.join(search.strategies())}, got {self.strategy!r}")


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



def record_point(kind: str, point: search_spaces.Point) -> str:
    """The ``point`` JSON of a record: the space kind, then the point's own fields.

    ``{"kind":"x86-conv2d-nchw","sketch":0,"decisions":[...]}``; records written before
    spaces had kinds lack ``kind`` and are sketch points (see :func:`parse_record_point`).
    """
    return f'{{"kind":{json.dumps(kind)},{point.to_json()[1:]}'


def parse_record_point(text: str) -> tuple[str, str]:
    """``(space kind, candidate id)`` of a record's ``point`` JSON (kind ``sketch`` if absent).

    Raises:
        ValueError: the text is not a point.
    """
    try:
        kind = str(json.loads(text).get("kind", "sketch"))
        point = search_spaces.Point.from_json(text)  # reads the point's own fields only
    except (TypeError, KeyError, AttributeError, ValueError) as err:
        raise ValueError(f"not a point: {text[:80]!r}") from err
    return kind, point.to_json()


@dataclass
class _TaskSearch:
    """One task's search: a strategy per applicable space, and the bandit that splits the
    task's trials between them."""

    kinds: list[str]
    spaces: list[search_spaces.SearchSpace]
    strategies: list[SearchStrategy]
    bandit: SpaceBandit
    #: Program hashes measured on this device (any job) or in flight: never measured again.
    hashes: set[str] = field(default_factory=set)
    exhausted: set[int] = field(default_factory=set)


@dataclass
class _Batch:
    """Candidates of one task and space proposed together and measured while the next batch
    is proposed."""

    task: int
    space: int
    candidates: list[Candidate]
    hashes: list[str]
    features: Any
    futures: list


class TuningJob:
    """One tuning job's state and loop.

    Holds the tasks, each task's spaces and strategies (created on its first visit and told
    every record of the task already in the database for this device: earlier jobs, a
    killed run of this one, teammates), the cost model, the task scheduler, the batches in
    flight, the error counts and the trial counters. :meth:`run` proposes, builds and times
    with ``PIPELINE_DEPTH`` batches in flight and writes every batch to the database as it
    completes. Not thread-safe; one job per process at a time.
    """

    def __init__(self, tasks: list[Task], device: Device, db: TuningDatabase, config: TuneConfig, *,
                 model_name: str, on_progress: Callable[[Progress], None] | None = None) -> None:  # fmt: skip
        self.tasks = tasks
        self.device = device
        self.db = db
        self.config = config
        self.model_name = model_name
        self.on_progress = on_progress
        # Replaced in run() by the model pre-trained on the database's records of this device family.
        self.model: cost_models.CostModel = cost_models.create("xgb", seed=config.seed)
        self.scheduler = TaskScheduler(tasks)
        self.searches: dict[int, _TaskSearch] = {}
        self.inflight: deque[_Batch] = deque()
        self.errors: dict[str, int] = {}
        self.submitted = 0
        self.done = 0
        self.device_id: int | None = None
        self.job_id: int | None = None
        self.measurer: RayMeasurer | None = None
        self._start = 0.0

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> TuneSummary:
        """Tune the tasks with ``config.trials`` measurements in all (see ``tune_tasks``)."""
        self._start = time.perf_counter()
        db, config = self.db, self.config
        # Builds target the device as the timing nodes see it, and records are keyed by their
        # fingerprint (not the driver's host: the driver may be on a node that does not time).
        self.measurer = RayMeasurer(self.device, config.measure)
        self.device = self.measurer.device
        try:
            self.device_id = db.device_id(self.device)
            for t in self.tasks:
                db.workload_id(t.workload_key, t.name, t.mod, t.flops)
            job_config = {"device": self.device.name} | _jsonable(asdict(config))
            self.job_id = db.start_job(self.model_name, self.device_id, job_config, config.trials)
            # Every earlier measurement of this device family (any job, any teammate, any task)
            # trains the model before the first proposal; without any, a stored model is loaded.
            self.model = cost_models.pretrain(db, self.device, seed=config.seed, max_records=PRETRAIN_RECORDS)
        except BaseException:
            self.measurer.close()
            raise
        if self.model.num_samples:
            logger.info("cost model pre-trained on %d records of this device family", self.model.num_samples)
        try:
            while True:
                while (len(self.inflight) < PIPELINE_DEPTH and self.submitted < config.trials
                       and not self.scheduler.all_done):  # fmt: skip
                    i = self._next_task()
                    if i is None:
                        break  # only tasks whose first batch is in flight are left: collect it
                    batch = self._propose(i)
                    if batch is not None:
                        self.inflight.append(batch)
                        self.submitted += len(batch.candidates)
                if not self.inflight:
                    break
                self._complete(self.inflight.popleft())
        except BaseException:
            db.update_job(self.job_id, state="failed")
            raise
        finally:
            stats = self.measurer.stats
            self.measurer.close()
        logger.info("device idle %.0f%% of %.0f s; %.1f s of builds", 100 * stats.device_idle_fraction,
                    stats.wall_s, stats.build_s)  # fmt: skip
        db.update_job(self.job_id, trials_done=self.done, state="done")
        if self.model.num_samples:
            db.save_cost_model(self.device_id, "xgb", self.model.save(), self.model.num_samples)
        best_sec = {self.tasks[j].workload_key: s for j, s in enumerate(self.scheduler.best_sec) if s}
        return TuneSummary(self.job_id, self.done, self.errors, best_sec, time.perf_counter() - self._start,
                           stats.device_idle_fraction)  # fmt: skip

    def _next_task(self) -> int | None:
        """The task of the next batch, or None while only tasks with a first batch in flight
        are left. Tasks whose first batch is in flight are passed over so the pipeline stays
        full (the scheduler's first round gives every task a batch before any gets a second)."""
        busy = {b.task for b in self.inflight if self.scheduler.trials[b.task] == 0}
        try:
            return self.scheduler.next_task(exclude=busy)
        except NoTaskAvailable:
            return None

    def _propose(self, i: int) -> _Batch | None:
        """Propose a batch of task ``i`` in one of its spaces and submit it; None if the
        space had nothing new to give."""
        assert self.measurer is not None
        config = self.config
        task = self.tasks[i]
        size = min(self.scheduler.first_batch_size(i, config.batch_size), config.trials - self.submitted)
        if self.scheduler.trials[i] == 0:
            # First visit: a budget too small for a full batch per task is spread so
            # that every task gets measured schedules before any gets a second batch.
            size = min(size, max(2, config.trials // len(self.tasks)))
        # The search runs on the driver: no timing on this node runs beside it (the node's lease).
        with self.measurer.cpu_work():
            ts = self._search(i)
            k = ts.bandit.choose(exclude=ts.exhausted)
            strategy = ts.strategies[k]
            # Different knobs can give the same program: one measured already (by any job,
            # any teammate, or in flight) is not measured again; the strategy is told it as a
            # failure so it is not proposed again either, and is asked for more in its place.
            keep: list[Candidate] = []
            hashes: list[str] = []
            feats = None
            for attempt in range(_PROPOSE_ROUNDS):
                proposal = strategy.propose(size - len(keep), self.model)
                if not proposal.candidates:
                    if attempt == 0:
                        logger.info("task %s: %s space exhausted", task.name, ts.kinds[k])
                        ts.exhausted.add(k)
                        if len(ts.exhausted) == len(ts.kinds):
                            self.scheduler.retire(i, "search space exhausted")
                    break
                fresh = []
                for n, c in enumerate(proposal.candidates):
                    h = program_hash(c.schedule.mod)
                    if h in ts.hashes:
                        strategy.tell(c.id, Result(None, "duplicate program"))
                        continue
                    ts.hashes.add(h)
                    fresh.append(n)
                    keep.append(c)
                    hashes.append(h)
                # A strategy's own features serve when one round filled the batch.
                if attempt == 0 and proposal.features is not None:
                    feats = proposal.features[fresh]
                if len(keep) >= size:
                    break
            if not keep:
                return None
            if feats is None or len(feats) != len(keep):
                feats = cost_models.extract_features(task.mod, self.device.target, [c.schedule for c in keep])
        # Counted when proposed, so the next batch, proposed while this one is in flight,
        # already sees this space's share (every space gets a first batch before a second).
        ts.bandit.update(k, len(keep), None)
        futures = self.measurer.submit(task, [c.schedule.mod for c in keep])
        return _Batch(i, k, keep, hashes, feats, futures)

    def _complete(self, batch: _Batch) -> None:
        """Wait for a batch, store it, and tell the strategy, model, bandit and scheduler."""
        assert self.job_id is not None and self.device_id is not None
        i, task = batch.task, self.tasks[batch.task]
        ts = self.searches[i]
        kind = ts.kinds[batch.space]
        results = [f.result() for f in batch.futures]
        if all((m.run.error_msg or "").startswith("reference:") for m in results):
            logger.warning("task %s has no reference output (%s); skipped", task.name, results[0].error_msg)
            self.scheduler.retire(i, "no reference output")
        target = self.device.target
        records, gflops = [], np.zeros(len(batch.candidates))
        args_info = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        best, failed = None, 0
        for n, (c, h, m) in enumerate(zip(batch.candidates, batch.hashes, results, strict=True)):
            r = m.run
            rec = ms.database.TuningRecord(c.schedule.trace, ms.database.Workload(task.mod),
                                           r.run_secs or None, target, args_info)  # fmt: skip
            error = m.error_class
            msg = m.error_msg
            if error is None and r.early_stopped:
                msg = f"stopped early: at least {min(r.run_secs):.3g} s (probe only)"
            records.append(NewRecord(
                workload_key=task.workload_key, point=record_point(kind, c.point),
                record_json=json.dumps(rec.as_json()), run_secs=r.run_secs,
                error_class=str(error) if error else None, error_msg=msg,
                build_sec=m.build.build_sec, program_hash=h,
            ))  # fmt: skip
            if error:
                failed += 1
                self.errors[str(error)] = self.errors.get(str(error), 0) + 1
                ts.strategies[batch.space].tell(c.id, Result(None, str(error)))
                continue
            # An early-stopped probe's one run is a lower bound: enough to rank it as slow.
            sec = float(min(r.run_secs)) if r.early_stopped else float(np.median(r.run_secs))
            ts.strategies[batch.space].tell(c.id, Result(sec))
            if r.early_stopped:
                gflops[n] = np.nan  # a probe is a lower bound, not a training label
                continue
            gflops[n] = task.flops / sec / 1e9 if task.flops else 1.0 / sec
            best = sec if best is None else min(best, sec)
        self.db.add_records(self.device_id, self.job_id, records)
        # Groups are workload keys, so this job's measurements join the pre-training records
        # of the same task.
        self.model.update(batch.features, gflops, np.full(len(batch.candidates), task.workload_key))
        ts.bandit.update(batch.space, 0, best)
        self.scheduler.update(i, len(batch.candidates), best, failed=failed)
        self.done += len(batch.candidates)
        self.db.update_job(self.job_id, trials_done=self.done)
        self._report(task)

    def _report(self, task: Task) -> None:
        if self.on_progress is None:
            return
        tasks = self.tasks
        self.on_progress(Progress(
            trials_done=self.done, trials_total=self.config.trials, task_name=task.name,
            tasks_done=sum(1 for n in self.scheduler.trials if n), num_tasks=len(tasks),
            errors=sum(self.errors.values()), elapsed_s=time.perf_counter() - self._start,
            best_gflops={tasks[j].name: tasks[j].flops / s / 1e9 for j, s in enumerate(self.scheduler.best_sec) if s},
        ))  # fmt: skip

    # --- per-task search state ---------------------------------------------------------------

    def _search(self, i: int) -> _TaskSearch:
        """Task ``i``'s spaces and strategies, created on first use and told the task's records."""
        if i in self.searches:
            return self.searches[i]
        task, config, target = self.tasks[i], self.config, self.device.target
        # Templates first: on a small budget a task's first share may be all it gets, and a
        # hand-written template's points are better on average than the sketches' (the x86
        # conv template beat MetaSchedule's initial population 1.6-2.8x, benchmarks/README.md).
        kinds = sorted(search_spaces.applicable_kinds(task.mod, target), key=lambda kind: kind == "sketch")
        spaces, strategies = [], []
        for k, kind in enumerate(kinds):
            space = search_spaces.create(task.mod, target, kind=kind, seed=config.seed + 1)
            spaces.append(space)
            strategies.append(self._strategy(space, task, kind, seed=config.seed * 1009 + i * 31 + k))
        assert self.device_id is not None
        ts = _TaskSearch(kinds, spaces, strategies, SpaceBandit(kinds),
                         hashes=self.db.measured_hashes(task.workload_key, self.device_id))  # fmt: skip
        self._replay(task, ts)
        self.searches[i] = ts
        return ts

    def _strategy(self, space: search_spaces.SearchSpace, task: Task, kind: str, *, seed: int) -> SearchStrategy:
        # A study name that a rerun of the same job derives again, so Optuna resumes it.
        study = "/".join([self.model_name, self.device.fingerprint, task.workload_key, kind,
                          self.config.strategy, f"seed{self.config.seed}"])  # fmt: skip
        options = {"seed": seed, "storage_url": self.db.url.render_as_string(hide_password=False),
                   "study_name": study}  # fmt: skip
        try:
            return search.create(self.config.strategy, space, **options)
        except ValueError as err:
            # Only grid refuses a space (too large to list); one task must not end the job.
            logger.warning("task %s, %s space: %s; searching it at random", task.name, kind, err)
            return search.create("random", space, **options)

    def _replay(self, task: Task, ts: _TaskSearch) -> None:
        """Tell each strategy the records of its space already stored for this device, and
        the bandit how each space has done: the population, the seen-set and the studies
        rebuild from the database."""
        assert self.device_id is not None
        by_kind = {kind: k for k, kind in enumerate(ts.kinds)}
        counts = [0] * len(ts.kinds)
        best: list[float | None] = [None] * len(ts.kinds)
        for text, mean_sec, error in measured_results(self.db, task.workload_key, self.device_id):
            try:
                kind, cid = parse_record_point(text)
            except ValueError:
                continue
            k = by_kind.get(kind)
            if k is None:
                continue  # a template no longer registered or not applicable
            ok = error is None and mean_sec is not None
            ts.strategies[k].tell(cid, Result(mean_sec if ok else None, error or (None if ok else "no time")))
            counts[k] += 1
            if ok and (best[k] is None or mean_sec < best[k]):  # type: ignore[operator]
                best[k] = mean_sec
        for k, n in enumerate(counts):
            if n:
                ts.bandit.update(k, n, best[k])
        if any(counts):
            logger.info("task %s: told %d stored records (%s)", task.name, sum(counts),
                        ", ".join(f"{kind} {n}" for kind, n in zip(ts.kinds, counts, strict=True)))  # fmt: skip


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
    most the batches in flight; a rerun tells its strategies every stored record, so no point
    is measured twice. The Ray cluster must already be connected.
    """
    return TuningJob(tasks, device, db, config, model_name=model_name, on_progress=on_progress).run()


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))
