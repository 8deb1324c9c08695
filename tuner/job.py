"""The tuning job: tasks -> proposals -> Ray builds and timings -> database and cost model.

:class:`TuningJob` holds the whole loop state (tasks, their spaces and strategies, the cost
model, the task scheduler, the batches in flight, errors and counters); ``tune_tasks`` runs one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

import cost_models
import search_spaces
from tuner import measure, search
from tuner.db import NewRecord, TuningDatabase
from tuner.db.store import measured_results
from tuner.db.validate import trace_rejection
from tuner.device import Device
from tuner.errors import DatabaseError, JobConflict, UserInputError
from tuner.graph.tasks import Task
from tuner.measure.base import MEASURERS, MeasureConfig, MeasureError, Measurer
from tuner.measure.quiet import LeaseTimeout
from tuner.measure.results import BuildResult, ErrorClass, Measurement, RunResult
from tuner.progress import EventSink, event
from tuner.rerank import rerank_task
from tuner.reuse import SEED_POINTS, TaskHistory, job_points, other_mode, seed_line, task_histories
from tuner.reuse import rule as reuse_rule
from tuner.search import SCHEDULERS, Candidate, NoTaskAvailable, Result, SearchStrategy, SpaceBandit, TaskScheduler
from tuner.search.remote import Applier, SpaceSpec

#: ``tune --cost-model`` choices (:attr:`TuneConfig.cost_model`).
COST_MODELS: tuple[str, ...] = ("pretrained", "online", "none")
logger = logging.getLogger(__name__)

# Batches in flight: one measured while the next is proposed.
PIPELINE_DEPTH = 2
# Newest records the cost model is pre-trained on at the start of a job: rebuilding a
# record's features costs ~10-20 ms on a 2-core machine.
PRETRAIN_RECORDS = 2_000
# Proposals per batch when candidates turn out to be programs measured already.
_PROPOSE_ROUNDS = 3
# A running job stamps its row this often (the schema promises at least every minute); a
# "running" job whose stamp is older than STALE_AFTER_S is dead (killed) and may be resumed.
HEARTBEAT_S = 20.0
STALE_AFTER_S = 90.0
# Rounds of look-and-claim in _open_job before giving up on a job that other processes keep
# starting and stopping (each round loses only to a process that did take the job).
_OPEN_ATTEMPTS = 5
# Tasks over which a run's failures must spread before TuneConfig.hopeless_after stops it.
HOPELESS_TASKS = 3
# The end-of-job re-ranking covers the tasks down to this share of the estimated latency:
# on ResNet-50 (2,048 trials, AVX2) the 14 heaviest tasks were 87% of it.
RERANK_SHARE = 0.02

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """Options of one tuning job.

    ``trials`` caps the measurements and ``time_budget_s`` the tuning time, both over every
    run of the job (a resumed job continues with what is left); give at least one.
    """

    trials: int | None = None
    batch_size: int = 16
    seed: int = 0
    strategy: str = search.DEFAULT_STRATEGY
    #: What ranks the proposals: ``pretrained`` (the device family's records, else a stored or
    #: the shipped model, learning online), ``online`` (untrained at the start, learning
    #: online) or ``none`` (no model: candidates ranked at random), the ablation's arms.
    cost_model: str = "pretrained"
    #: Which task gets the next batch (one of ``SCHEDULERS``): ``gradient``, Ansor's rule
    #: (:class:`~tuner.search.TaskScheduler`); ``round-robin``, the task with the fewest trials,
    #: the ablation's baseline.
    scheduler: str = "gradient"
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    time_budget_s: float | None = None
    #: What ``tune --job NAME`` resumes by; None: the model and the device's name.
    name: str | None = None
    #: Ignore other jobs' records: no task skipped, no strategy told them.
    fresh: bool = False
    #: A task with this many successful records on the device is skipped (0: never).
    skip_after: int = 512
    #: How long a lost database or Ray cluster is waited for before the job stops.
    retry_s: float = 300.0
    #: Where measurements go when the database stays unreachable; written when the job resumes.
    spool_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "nightshift" / "spool")
    #: Where proposals' TVM work (sampling, applying, features) runs: ``driver``, this
    #: process; ``cluster``, Ray tasks on any CPU, many points at once (``tuner.search.remote``).
    #: ``driver`` by default: on a 2-core node proposing costs ~6% of the device's time per
    #: trial, and Ray tasks, which queue behind builds and the timing lease at every round of
    #: a proposal, made the job 2x slower (benchmarks/README.md, proposal).
    propose_on: str = "driver"
    #: A run whose first this many candidates all failed, over ``HOPELESS_TASKS`` tasks or
    #: more, stops (0: never): the device or the build cannot measure anything (a target
    #: whose instructions the CPU lacks, a timeout no candidate meets, a broken worker), and
    #: each task's own limit (TaskScheduler.max_failed_trials) would end it only after every
    #: task had failed 64 times.
    hopeless_after: int = 32
    #: Points per space a task with no records of the job's timing mode is seeded with from
    #: the other mode's records (``tuner.reuse``; 0: none, as with ``fresh``).
    seed_points: int = SEED_POINTS
    #: When the search ends, each heavy task's this many fastest records are timed in
    #: interleaved rounds and ranked by those times (``tuner.rerank``; 0 or 1: off; ``tune``
    #: asks for 4). Only on a CPU device that the driver's node times (a local cluster).
    rerank_top: int = 0
    #: Rounds of the re-ranking: every record is timed once per round.
    rerank_rounds: int = 10
    #: What builds and times the candidates (``tuner.measure.base.create``): ``ray``, a Ray
    #: cluster (connected before the job runs); ``inline``, this process, without Ray.
    measurer: str = "ray"
    #: The model options the job was started with (:meth:`tuner.app.model.ModelOptions.stored`),
    #: kept in its configuration so that ``compile --job`` and ``bench --job`` load the same model.
    model_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.trials is None and self.time_budget_s is None:
            raise UserInputError("give --trials, --time-budget or both")
        if self.trials is not None and self.trials <= 0:
            raise UserInputError(f"--trials must be a positive integer, got {self.trials}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise UserInputError(f"--time-budget must be positive, got {self.time_budget_s}")
        if self.batch_size <= 0:
            raise UserInputError(f"--batch must be a positive integer, got {self.batch_size}")
        if self.skip_after < 0:
            raise UserInputError(f"--skip-after must be 0 or more, got {self.skip_after}")
        if self.hopeless_after < 0:
            raise UserInputError(f"hopeless_after must be 0 or more, got {self.hopeless_after}")
        if self.seed_points < 0:
            raise UserInputError(f"seed_points must be 0 or more, got {self.seed_points}")
        if self.rerank_top < 0 or self.rerank_rounds < 1:
            raise UserInputError(f"--rerank-top must be 0 or more and rerank_rounds 1 or more, got "
                                 f"{self.rerank_top} and {self.rerank_rounds}")  # fmt: skip
        if self.propose_on not in ("cluster", "driver"):
            raise UserInputError(f"propose_on must be cluster or driver, got {self.propose_on!r}")
        if self.propose_on == "cluster" and self.measurer != "ray":
            raise UserInputError("propose_on cluster runs proposals as Ray tasks: it needs the ray measurer")
        if self.measurer not in MEASURERS:
            raise UserInputError(f"--measurer must be one of {', '.join(MEASURERS)}, got {self.measurer!r}")
        if self.strategy not in search.strategies():
            raise UserInputError(f"--strategy must be one of {', '.join(search.strategies())}, got {self.strategy!r}")
        if self.cost_model not in COST_MODELS:
            raise UserInputError(f"--cost-model must be one of {', '.join(COST_MODELS)}, got {self.cost_model!r}")
        if self.scheduler not in SCHEDULERS:
            raise UserInputError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")


class NothingMeasurable(MeasureError):
    """Every candidate of a job's first batches failed, over several tasks."""


class JobRunning(UserInputError):
    """Another process runs the job (its heartbeat is fresh)."""


@dataclass(frozen=True)
class TuneSummary:
    """Outcome of a job's run.

    ``trials`` and ``elapsed_s`` count every run of the job; ``state`` is ``done`` (budget
    spent, trials cap reached or every task done) or ``stopped``.
    """

    job_id: int
    trials: int
    errors: dict[str, int]
    best_sec: dict[str, float]
    elapsed_s: float
    device_idle_fraction: float | None = None
    name: str = ""
    state: str = "done"
    reason: str = ""


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
    #: Where proposing it went (seconds): ``lease`` (waiting for the node's CPU lease),
    #: ``spaces`` (the task's spaces built and told its records, on its first visit), the
    #: strategy's ``sample``/``apply``/``features``/``predict`` (``remote``: waiting for the
    #: Ray tasks that sample, apply and featurize), the job's ``hash`` and ``job_features``,
    #: ``submit``, ``total``.
    seconds: dict[str, float] = field(default_factory=dict)


class TuningJob:
    """One tuning job's state and loop.

    Holds the tasks, each task's spaces and strategies (created on its first visit and told
    every record of the task already in the database for this device: earlier jobs, a
    killed run of this one, teammates), the cost model, the task scheduler, the batches in
    flight, the error counts, the trial counters and the budget. :meth:`run` proposes, builds
    and times with ``PIPELINE_DEPTH`` batches in flight and writes every batch to the
    database as it completes.

    The database is the job's state: a job is found by its name on this device, and a job of
    that name that did not finish (killed, interrupted, failed) is resumed: its tuning time
    and trials so far count against the budget, its records rebuild the strategies, the
    cost model and the scheduler, and a candidate is never measured twice. Not
    thread-safe; one job per process at a time.
    """

    def __init__(self, tasks: list[Task], device: Device, db: TuningDatabase, config: TuneConfig, *,
                 model_name: str, on_event: EventSink | None = None) -> None:  # fmt: skip
        self.tasks = tasks
        self.device = device
        self.db = db
        self.config = config
        self.model_name = model_name
        self.name = config.name or f"{model_name}-{device.name}"
        #: records.timing of this job's measurements; only records of this mode are reused.
        self.timing = config.measure.timing.mode(device.kind)
        self.on_event = on_event
        # Replaced in run() by the model pre-trained on the database's records of this device family.
        self.model: cost_models.CostModel = cost_models.create("xgb", seed=config.seed)
        self.scheduler = TaskScheduler(tasks, mode=config.scheduler, budget=config.trials)
        self.searches: dict[int, _TaskSearch] = {}
        self.inflight: deque[_Batch] = deque()
        # Seconds between batch completions (moving average): how long the batches in flight
        # take to drain, which the time budget must leave room for.
        self._batch_pace_s: float | None = None
        self._last_completion: float | None = None
        self.errors: dict[str, int] = {}
        # This run's successes, and its failures' tasks and first messages (see _check_hopeless).
        self._run_ok = 0
        self._run_failed_tasks: set[int] = set()
        self._run_failures: dict[str, str] = {}
        self.submitted = 0
        self.done = 0
        self.device_id: int | None = None
        self.job_id: int | None = None
        self.resumed = False
        self.measurer: Measurer | None = None
        #: Tuning seconds of the job's earlier runs.
        self.elapsed_before = 0.0
        #: Per task: ``new``, ``warm``, ``skip`` or ``fresh`` (see tuner.reuse.rule).
        self.reuse: list[str] = ["new"] * len(tasks)
        #: Tasks seeded from the other timing mode's records (see tuner.reuse).
        self.seeded: set[int] = set()
        self._start = 0.0
        self._stop_heartbeat = threading.Event()
        self._interrupted = threading.Event()

    # --- budget ------------------------------------------------------------------------------

    @property
    def elapsed_s(self) -> float:
        """Tuning seconds over every run of the job."""
        return self.elapsed_before + (time.perf_counter() - self._start if self._start else 0.0)

    def _trials_left(self) -> int:
        cap = self.config.trials
        return 1 << 62 if cap is None else cap - self.submitted

    def _out_of_time(self, batches_ahead: int = 0) -> bool:
        """Whether the budget is spent, or would be by the time ``batches_ahead`` more batches
        complete at the pace batches have been completing (so the batches in flight at the
        deadline do not run past it)."""
        budget = self.config.time_budget_s
        ahead = batches_ahead * self._batch_pace_s if self._batch_pace_s else 0.0
        return budget is not None and self.elapsed_s + ahead >= budget

    def _completed(self) -> None:
        """A batch completed: update the pace of completions (seconds since the last one)."""
        now = time.perf_counter()
        if self._last_completion is not None:
            took = now - self._last_completion
            self._batch_pace_s = took if self._batch_pace_s is None else 0.7 * self._batch_pace_s + 0.3 * took
        self._last_completion = now

    def _stop_reason(self) -> str:
        if self.scheduler.all_done:
            return "every task done"
        if self._out_of_time(batches_ahead=1):
            return "time budget spent"
        if self._trials_left() <= 0:
            return "trials cap reached"
        return "no candidates left"

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> TuneSummary:
        """Run (or resume) the job until its budget is spent, its trials cap is reached or
        every task is done (see ``tune_tasks``).

        Raises:
            KeyboardInterrupt: after recording the job as ``stopped`` (resumable), the
                batches in flight dropped (they are measured again on resume).
            DatabaseError: the database stayed unreachable for ``config.retry_s``; the
                measurements it could not take are in the spool file named in the message.
        """
        self._start = time.perf_counter()
        db, config = self.db, self.config
        # Builds target the device as the timing nodes see it, and records are keyed by their
        # fingerprint (not the driver's host: the driver may be on a node that does not time).
        self.measurer = measure.create(config.measurer, self.device, config.measure)
        self.device = self.measurer.device
        try:
            self.device_id = db.device_id(self.device)
            for t in self.tasks:
                db.workload_id(t.workload_key, t.name, t.mod, t.flops)
            self._open_job()
            assert self.job_id is not None
            self._unspool()
            # Every earlier measurement of this device family (any job, any teammate, any task)
            # trains the model before the first proposal; without any, a stored model is loaded.
            # A resumed job's own records are among them: its model is rebuilt the same way.
            if config.cost_model == "pretrained":
                self.model = cost_models.pretrain(db, self.device, seed=config.seed, max_records=PRETRAIN_RECORDS)
            else:
                self.model = cost_models.create("random" if config.cost_model == "none" else "xgb", seed=config.seed)
            if self.model.num_samples:
                logger.info("cost model pre-trained on %d records of this device family", self.model.num_samples)
            rules = self._restore()
        except BaseException:
            self.measurer.close()
            raise
        self._emit("job_start", job_id=self.job_id, name=self.name, model=self.model_name, device=self.device.name,
                   resumed=self.resumed, time_budget_s=config.time_budget_s, trials_cap=config.trials,
                   trials_before=self.done, elapsed_before_s=self.elapsed_before, tasks=[
                       {"index": i, "name": t.name, "workload_key": t.workload_key, "weight": t.weight,
                        "flops": t.flops, "choice": t.choice, "plans": list(t.plans), "reuse": self.reuse[i],
                        "reuse_rule": rules[i],
                        "trials": self.scheduler.trials[i], "best_sec": self.scheduler.best_sec[i],
                        "done": self.scheduler.done_reason(i)}
                       for i, t in enumerate(self.tasks)])  # fmt: skip
        heartbeat = threading.Thread(target=self._heartbeat, name="nightshift-heartbeat", daemon=True)
        heartbeat.start()
        state, reason = "failed", "error"
        try:
            with self._ctrl_c():
                self._loop()
                stop_reason = self._stop_reason()
                self._rerank()
            state, reason = "done", stop_reason
        except KeyboardInterrupt:
            state, reason = "stopped", "interrupted"
            raise
        except BaseException as err:
            if self._interrupted.is_set():
                # A second Ctrl-C inside TVM's C++ code comes back as a RuntimeError.
                state, reason = "stopped", "interrupted"
                raise KeyboardInterrupt from err
            reason = f"{type(err).__name__}: {err}"
            raise
        finally:
            self._stop_heartbeat.set()
            heartbeat.join(timeout=30)  # its last stamp must not land after the job's end
            stats = self.measurer.stats
            self.measurer.close()
            self._finish_job(state, reason)
        logger.info("device idle %.0f%% of %.0f s; %.1f s of builds", 100 * stats.device_idle_fraction,
                    stats.wall_s, stats.build_s)  # fmt: skip
        if self.model.num_samples and config.cost_model != "none":
            self._retrying("database", db.save_cost_model, self.device_id, "xgb", self.model.save(),
                           self.model.num_samples)  # fmt: skip
        best_sec = {self.tasks[j].workload_key: s for j, s in enumerate(self.scheduler.best_sec) if s}
        return TuneSummary(self.job_id, self.done, self.errors, best_sec, self.elapsed_s,
                           stats.device_idle_fraction, self.name, state, reason)  # fmt: skip

    @contextlib.contextmanager
    def _ctrl_c(self):
        """The first Ctrl-C asks the loop to stop between steps; a second one stops at once.

        A KeyboardInterrupt raised anywhere would land inside TVM's C++ calls (sketch replay,
        feature extraction), which hand it back as a RuntimeError, and the job would record a
        failure instead of a clean stop.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame) -> None:
            if self._interrupted.is_set():
                raise KeyboardInterrupt
            self._interrupted.set()
            logger.warning("stopping after the current step; Ctrl-C again to stop at once")

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _check_interrupt(self) -> None:
        if self._interrupted.is_set():
            raise KeyboardInterrupt

    def _loop(self) -> None:
        """Propose, measure and record batches until a stop condition (see ``run``)."""
        while True:
            self._check_interrupt()
            while (len(self.inflight) < PIPELINE_DEPTH and self._trials_left() > 0
                   and not self.scheduler.all_done and not self._out_of_time(len(self.inflight) + 1)):  # fmt: skip
                i = self._next_task()
                if i is None:
                    break  # only tasks whose first batch is in flight are left: collect it
                batch = self._propose(i)
                self._check_interrupt()
                if batch is not None:
                    self.inflight.append(batch)
                    self.submitted += len(batch.candidates)
                    self._emit("batch_submitted", task=i, task_name=self.tasks[i].name,
                               trials=len(batch.candidates), elapsed_s=self.elapsed_s,
                               propose_s=batch.seconds)  # fmt: skip
            if not self.inflight:
                return
            self._complete(self.inflight.popleft())
            self._completed()

    def _rerank(self) -> None:
        """Re-rank the records of the tasks the model runs that each carry ``RERANK_SHARE`` or
        more of the estimated latency, heaviest first (:func:`tuner.rerank.rerank_task`); the
        scheduler's bests (the closing estimate) follow. Skipped where this process cannot
        time for the device."""
        if self.config.rerank_top < 2 or self.device.kind != "cpu":
            return
        lease = self.measurer.timing_lease()
        if lease is None:
            logger.info("records not re-ranked: this process cannot time for the device")
            return
        assert self.device_id is not None
        self.device.use_threads()
        # What each task adds to the model's latency; layouts the model does not run add nothing.
        weighted = {j: c for j in range(len(self.tasks))
                    if self.scheduler.in_model(j) and (c := self.scheduler.contribution(j)) is not None}  # fmt: skip
        total = sum(weighted.values())
        heavy = [j for j in sorted(weighted, key=lambda j: -weighted[j]) if weighted[j] >= RERANK_SHARE * total]
        logger.info("re-ranking the %d fastest records of %d tasks in %d interleaved rounds",
                    self.config.rerank_top, len(heavy), self.config.rerank_rounds)  # fmt: skip
        for j in heavy:
            self._check_interrupt()
            task = self.tasks[j]
            try:
                result = self._retrying("database", rerank_task, self.db, task, self.device_id,
                                        self.device.target, self.timing, self.config.measure.timing,
                                        top=self.config.rerank_top, rounds=self.config.rerank_rounds, lease=lease,
                                        cpu_work=self.measurer.cpu_work)  # fmt: skip
            except LeaseTimeout as err:
                # Re-ranking only refines bests already stored: a node that stays busy ends it,
                # not the job (the next run of the command re-ranks again).
                logger.warning("re-ranking stopped at task %s: %s", task.name, err)
                break
            if result is None:
                continue
            self.scheduler.best_sec[j] = result.best_sec
            self._emit("task_reranked", task=j, task_name=task.name, stored_sec=result.stored_sec,
                       best_sec=result.best_sec, retimed=result.retimed, changed=result.changed,
                       elapsed_s=self.elapsed_s)  # fmt: skip
        # A Ctrl-C during the last task's rounds stops the job too (the next run re-ranks again).
        self._check_interrupt()

    def _finish_job(self, state: str, reason: str) -> None:
        """Record the job's end: its state, tuning time and trials (counted from its records,
        which a batch interrupted mid-write may or may not have reached)."""
        assert self.job_id is not None
        elapsed = self.elapsed_s
        try:
            self.done = self.db.job_trials(self.job_id)
            self.db.update_job(self.job_id, state=state, trials_done=self.done, elapsed_sec=elapsed, heartbeat=True)
        except DatabaseError as err:
            # The job ends anyway; its records are safe, only its row is stale.
            logger.warning("could not record job %s as %s: %s", self.name, state, err)
        self._emit("job_end", job_id=self.job_id, name=self.name, state=state, reason=reason,
                   trials_done=self.done, elapsed_s=elapsed, errors=dict(self.errors),
                   best_sec={t.name: s for t, s in zip(self.tasks, self.scheduler.best_sec, strict=True)})  # fmt: skip

    def _open_job(self) -> None:
        """Resume the unfinished job of this name on this device, or start a new one.

        Several processes may open the same name at once: the database lets one of them
        insert a running row (``ux_jobs_running``) or take over a stopped one
        (:meth:`TuningDatabase.claim_job`); the others then see it running and stop.

        Raises:
            JobRunning: another live process runs the job.
        """
        assert self.device_id is not None
        db, config = self.db, self.config
        # The process id lets a rerun on the same host see at once that a killed run is dead.
        settings = {"device": self.device.name, "pid": os.getpid(), "timing": self.timing} | _jsonable(asdict(config))
        # The report weighs each task's best by how often the model calls it.
        settings["tasks"] = [{"workload_key": t.workload_key, "weight": t.weight, "choice": t.choice,
                              "plans": list(t.plans)} for t in self.tasks]
        total = config.trials or 0
        for _ in range(_OPEN_ATTEMPTS):
            # A running row first: an older killed run may sit under a newer finished one.
            row = db.find_job(self.name, self.device_id, state="running") or db.find_job(self.name, self.device_id)
            if row is None or row.state == "done":
                try:
                    self.job_id = db.start_job(self.model_name, self.device_id, settings, total, name=self.name,
                                               time_budget_sec=config.time_budget_s)  # fmt: skip
                    return
                except JobConflict:
                    continue  # another process started it just now: look at its row
            if row.model != self.model_name:
                raise UserInputError(f"job {self.name!r} tunes {row.model}, not {self.model_name}; "
                                     "pass another --job name")  # fmt: skip
            beat = row.heartbeat_at
            if beat is not None and beat.tzinfo is None:
                beat = beat.replace(tzinfo=UTC)  # SQLite hands back naive UTC
            age = None if beat is None else (datetime.now(UTC) - beat).total_seconds()
            if row.state == "running" and age is not None and age < STALE_AFTER_S and _alive(row):
                raise JobRunning(f"job {self.name!r} (#{row.id}) is running on {row.host}, process "
                                 f"{_pid(row) or '?'} (heartbeat {age:.0f} s ago); wait for it or stop it, "
                                 "or pass another --job name")  # fmt: skip
            done = db.job_trials(row.id)
            if not db.claim_job(row.id, seen_state=row.state, seen_heartbeat=row.heartbeat_at, config=settings,
                                trials_done=done, trials_total=total, time_budget_sec=config.time_budget_s):
                continue  # another process resumed it first
            self.job_id, self.resumed = row.id, True
            self.elapsed_before = float(row.elapsed_sec or 0.0)
            self.done = self.submitted = done
            logger.info("resuming job %s (#%d): %d trials, %.0f s so far", self.name, row.id, self.done,
                        self.elapsed_before)  # fmt: skip
            return
        raise JobRunning(f"job {self.name!r} keeps being started by other processes; wait for them, "
                         "or pass another --job name")

    def _restore(self) -> list[str]:
        """Rebuild the scheduler from the database and decide each task's reuse; return the
        rule line printed for each task."""
        assert self.device_id is not None and self.job_id is not None
        histories = task_histories(self.db, self.device_id, self.job_id, [t.workload_key for t in self.tasks],
                                   self.timing)  # fmt: skip
        others = {} if self.config.fresh or not self.config.seed_points else task_histories(
            self.db, self.device_id, self.job_id, [t.workload_key for t in self.tasks], other_mode(self.timing))
        lines = []
        for i, t in enumerate(self.tasks):
            h = histories.get(t.workload_key, TaskHistory())
            decision, line = reuse_rule(h, skip_after=self.config.skip_after, fresh=self.config.fresh)
            self.reuse[i] = decision
            seeding = None
            if decision == "new" and not h.records:  # a resumed job goes on from its own records
                seeding = seed_line(others.get(t.workload_key, TaskHistory()), self.timing, self.config.seed_points)
            if seeding is not None:
                self.seeded.add(i)
                line = seeding
            lines.append(line)
            best = h.own_best_sec if decision in ("new", "fresh") else h.best_sec
            # Trials of this job count toward the task's share; the best of earlier jobs sets
            # where it starts from.
            if h.own or best is not None:
                self.scheduler.update(i, h.own, best, failed=0)
            if decision == "skip":
                self.scheduler.retire(i, f"skipped: tuned by earlier jobs ({h.ok} good records)")
        return lines

    def _heartbeat(self) -> None:
        """Stamp the job's row and tuning time every ``HEARTBEAT_S`` while it runs."""
        assert self.job_id is not None
        while not self._stop_heartbeat.wait(HEARTBEAT_S):
            try:
                self.db.update_job(self.job_id, elapsed_sec=self.elapsed_s, heartbeat=True)
            except Exception as err:  # any failure: a thread traceback would reach the terminal; the job goes on
                logger.warning("heartbeat of job %s failed: %s: %s", self.name, type(err).__name__, err)

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(event(kind, **fields))

    # --- faults ------------------------------------------------------------------------------

    def _retrying(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args)``, retried with backoff while the database is unreachable, for up
        to ``config.retry_s``; then the error is raised."""
        deadline = time.monotonic() + self.config.retry_s
        delay, attempt = 1.0, 0
        while True:
            try:
                return call(*args, **kwargs)
            except DatabaseError as err:
                attempt += 1
                if not _connection_lost(err) or time.monotonic() + delay > deadline:
                    raise
                logger.warning("%s unreachable (%s); retry %d in %.0f s", what, err, attempt, delay)
                self._emit("retry", what=what, error=str(err), attempt=attempt, delay_s=delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _spool_path(self) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
        return self.config.spool_dir / f"{safe}-{self.device.fingerprint}.jsonl"

    def _store(self, records: list[NewRecord]) -> None:
        """Write a batch's records; if the database stays unreachable, keep them in the
        spool file (written when the job resumes) and stop."""
        assert self.device_id is not None
        try:
            self._retrying("database", self.db.add_records, self.device_id, self.job_id, records)
        except DatabaseError as err:
            if not _connection_lost(err):
                raise
            path = self._spool_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(asdict(r) | {"run_secs": list(r.run_secs)}) + "\n")
            raise DatabaseError(f"{err}; stopped after {self.config.retry_s:.0f} s of retries, the "
                                f"{len(records)} measurements it could not take are kept in {path} and "
                                "written when the job resumes (run the same command)") from err  # fmt: skip

    def _unspool(self) -> None:
        """Write the measurements an earlier run kept when the database was lost."""
        path = self._spool_path()
        if not path.exists():
            return
        assert self.device_id is not None
        records = [NewRecord(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        n = self.db.add_records(self.device_id, self.job_id, records)
        path.unlink()
        logger.warning("wrote %d measurements kept in %s while the database was lost", n, path)

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
        left = self._trials_left()
        capped = left if config.trials is not None else None
        busy = {b.task for b in self.inflight}
        size = min(self.scheduler.first_batch_size(i, config.batch_size, capped, busy), left)
        seconds: dict[str, float] = {}
        start = time.perf_counter()
        # Work on the driver holds its node's lease, so no timing on this node runs beside it.
        with self.measurer.cpu_work():
            seconds["lease"] = time.perf_counter() - start
            ts = self._search(i)
            seconds["spaces"] = time.perf_counter() - start - seconds["lease"]
        k = ts.bandit.choose(exclude=ts.exhausted)
        strategy = ts.strategies[k]
        # With an applier TVM's work runs in Ray tasks, which hold the lease of their own node
        # while they work; the driver only waits for them and must not hold its node's.
        with contextlib.nullcontext() if strategy.applier is not None else self.measurer.cpu_work():
            keep, hashes, rows = self._gather(i, k, size, seconds)
            if not keep:
                return None
            # Only what the strategy did not featurize is extracted here: once per candidate.
            missing = [n for n, f in enumerate(rows) if f is None]
            if missing:
                extracted = time.perf_counter()
                got = cost_models.extract_features(task.mod, self.device.target, [keep[n].schedule for n in missing])
                for j, n in enumerate(missing):
                    rows[n] = got.candidate(j)
                seconds["job_features"] = time.perf_counter() - extracted
        feats = cost_models.StoreFeatures.from_list(rows)  # type: ignore[arg-type]
        # Counted when proposed, so the next batch, proposed while this one is in flight,
        # already sees this space's share (every space gets a first batch before a second).
        ts.bandit.update(k, len(keep), None)
        submitted = time.perf_counter()
        futures = self.measurer.submit(task, [c.mod for c in keep])
        seconds["submit"] = time.perf_counter() - submitted
        seconds["total"] = time.perf_counter() - start
        return _Batch(i, k, keep, hashes, feats, futures, {w: round(v, 4) for w, v in seconds.items()})

    def _gather(self, i: int, k: int, size: int,
                seconds: dict[str, float]) -> tuple[list[Candidate], list[str], list[np.ndarray | None]]:  # fmt: skip
        """Up to ``size`` candidates of task ``i``'s space ``k`` whose programs were never
        measured, their program hashes, and the features the strategy made of them (None
        where it made none).

        Different knobs can give the same program: one measured already (by any job, any
        teammate, or in flight) is not measured again; the strategy is told it as a failure
        so it is not proposed again either, and is asked for more in its place.
        """
        ts, task = self.searches[i], self.tasks[i]
        strategy = ts.strategies[k]
        keep: list[Candidate] = []
        hashes: list[str] = []
        rows: list[np.ndarray | None] = []
        for attempt in range(_PROPOSE_ROUNDS):
            proposal = strategy.propose(size - len(keep), self.model)
            for what, sec in proposal.seconds.items():
                seconds[what] = seconds.get(what, 0.0) + sec
            if not proposal.candidates:
                if attempt == 0:
                    logger.info("task %s: %s space exhausted", task.name, ts.kinds[k])
                    ts.exhausted.add(k)
                    if len(ts.exhausted) == len(ts.kinds):
                        self.scheduler.retire(i, "search space exhausted")
                break
            made = proposal.features or [None] * len(proposal.candidates)
            hashed = time.perf_counter()
            for c, f in zip(proposal.candidates, made, strict=True):
                h = c.program_hash
                if h in ts.hashes:
                    strategy.tell(c.id, Result(None, "duplicate program"))
                    continue
                ts.hashes.add(h)
                keep.append(c)
                hashes.append(h)
                rows.append(f if f is not None or c.applied is None else c.applied.features)
            seconds["hash"] = seconds.get("hash", 0.0) + time.perf_counter() - hashed
            if len(keep) >= size:
                break
        return keep, hashes, rows

    def _results(self, batch: _Batch) -> list:
        """The batch's measurements. When the Ray cluster is lost (the measurer fails, or
        every candidate comes back lost with its node), wait for it with backoff for up to
        ``config.retry_s`` and measure the batch again; then stop with a clear error (the
        batch is not recorded: a resumed job measures it)."""
        assert self.measurer is not None
        try:
            results = self._await(batch.futures)
            if not all(m.error_class == ErrorClass.LOST for m in results) or self.measurer.alive():
                return results
            cause: BaseException = RuntimeError(results[0].error_msg or "every candidate lost")
        except MeasureError as err:
            cause = err
        deadline = time.monotonic() + self.config.retry_s
        delay, attempt = 1.0, 0
        while not self.measurer.alive():
            attempt += 1
            if time.monotonic() + delay > deadline:
                raise MeasureError(f"Ray cluster lost ({cause}) and not back after {self.config.retry_s:.0f} s; "
                                   "nothing measured is lost: run the same command to resume") from cause  # fmt: skip
            self._emit("retry", what="Ray cluster", error=str(cause), attempt=attempt, delay_s=delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
        logger.warning("Ray cluster back after loss (%s); measuring the batch again", cause)
        self.measurer.close()
        self.measurer = measure.create(self.config.measurer, self.device, self.config.measure)
        mods = [c.mod for c in batch.candidates]
        again = self.measurer.submit(self.tasks[batch.task], mods)
        # Batches proposed before the loss were submitted to the old measurer: submit them again.
        for other in self.inflight:
            other.futures = self.measurer.submit(self.tasks[other.task], [c.mod for c in other.candidates])
        return self._await(again)

    def _await(self, futures: list[concurrent.futures.Future]) -> list[Measurement]:
        """The measurements of ``futures``, in order, waiting at most the measure config's
        ``candidate_wait()`` for each next one: a measurer that stops resolving a candidate
        (a lost call, an engine bug) must not hang the job, so the rest are ``LOST`` (measured
        again by a later run) and the job goes on.

        Raises:
            MeasureError: as ``Future.result`` (the measurer itself failed).
        """
        bound = self.config.measure.candidate_wait()
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=bound,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)  # fmt: skip
            if not done:
                logger.error("%d of %d candidates got no result within %.0f s of the last one; recorded as lost",
                             len(pending), len(futures), bound)  # fmt: skip
                break
        msg = f"no result within {bound:.0f} s (the job stopped waiting)"
        lost = Measurement(BuildResult(None, 0.0), RunResult(error_class=ErrorClass.LOST, error_msg=msg))
        # The measurer may still resolve those later: its futures are left alone.
        return [f.result() if f.done() else lost for f in futures]

    def _complete(self, batch: _Batch) -> None:
        """Wait for a batch, store it, and tell the strategy, model, bandit and scheduler."""
        assert self.job_id is not None and self.device_id is not None
        i, task = batch.task, self.tasks[batch.task]
        ts = self.searches[i]
        kind = ts.kinds[batch.space]
        waited = time.perf_counter()
        results = self._results(batch)
        waited = time.perf_counter() - waited
        if all((m.run.error_msg or "").startswith("reference:") for m in results):
            logger.warning("task %s has no reference output (%s); skipped", task.name, results[0].error_msg)
            self.scheduler.retire(i, "no reference output")
        target = self.device.target
        records, gflops = [], np.zeros(len(batch.candidates))
        args_info = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        best, failed = None, 0
        for n, (c, h, m) in enumerate(zip(batch.candidates, batch.hashes, results, strict=True)):
            r = m.run
            # The trace comes as JSON (a Ray task may have applied the point): the record is
            # made around an empty trace, then given the candidate's.
            rec = ms.database.TuningRecord(Trace([], {}), ms.database.Workload(task.mod),
                                           r.run_secs or None, target, args_info).as_json()  # fmt: skip
            rec[0] = trace = c.trace_json
            error = m.error_class
            msg = m.error_msg
            # The compiler replays only traces the allow-list passes: a timing of any other is
            # a failure here, so the job's best is the compiled model's and the refusal is loud.
            if error is None and (refused := trace_rejection(trace)) is not None:
                error, msg = ErrorClass.REFUSED_TRACE, f"trace refused by tuner.db.validate's allow-list: {refused}"
                logger.error("task %s: a measured candidate's %s", task.name, msg)
            if error is None and r.early_stopped:
                msg = f"stopped early: at least {min(r.run_secs):.3g} s (probe only)"
            records.append(NewRecord(
                workload_key=task.workload_key, point=record_point(kind, c.point),
                record_json=json.dumps(rec), run_secs=r.run_secs,
                error_class=str(error) if error else None, error_msg=msg,
                build_sec=m.build.build_sec, program_hash=h, run_wall_sec=r.busy_s or None,
                timing=self.timing,
            ))  # fmt: skip
            if error:
                failed += 1
                self.errors[str(error)] = self.errors.get(str(error), 0) + 1
                self._run_failures.setdefault(str(error), (msg or "").strip().split("\n")[0][:200])
                ts.strategies[batch.space].tell(c.id, Result(None, str(error)))
                continue
            # The mean, as the database stores and ranks it (mean_sec): the job's best is the
            # record the compiler will pick. An early-stopped probe's one run is a lower bound:
            # enough to rank it as slow.
            sec = float(np.mean(r.run_secs))
            ts.strategies[batch.space].tell(c.id, Result(sec))
            if r.early_stopped:
                gflops[n] = np.nan  # a probe is a lower bound, not a training label
                continue
            gflops[n] = task.flops / sec / 1e9 if task.flops else 1.0 / sec
            best = sec if best is None else min(best, sec)
        self._store(records)
        self._run_ok += len(batch.candidates) - failed
        if failed:
            self._run_failed_tasks.add(i)
        # Groups are workload keys, so this job's measurements join the pre-training records
        # of the same task.
        self.model.update(batch.features, gflops, np.full(len(batch.candidates), task.workload_key))
        ts.bandit.update(batch.space, 0, best)
        was_done = self.scheduler.is_done(i)
        self.scheduler.update(i, len(batch.candidates), best, failed=failed)
        self.done += len(batch.candidates)
        self._retrying("database", self.db.update_job, self.job_id, trials_done=self.done, elapsed_sec=self.elapsed_s,
                       heartbeat=True)  # fmt: skip
        by_class: dict[str, int] = {}
        for r in records:
            if r.error_class:
                by_class[r.error_class] = by_class.get(r.error_class, 0) + 1
        # What the batch cost the device and the builders, and how long the job waited for it
        # (near 0: proposing, not measuring, sets the pace), to set against proposal times.
        device_s = sum(m.run.busy_s for m in results)
        build_s = sum(m.build.build_sec for m in results)
        self._emit("batch_done", task=i, task_name=task.name, space=kind, trials=len(batch.candidates),
                   errors=by_class, best_sec=best, task_best_sec=self.scheduler.best_sec[i],
                   task_trials=self.scheduler.trials[i], trials_done=self.done, elapsed_s=self.elapsed_s,
                   device_s=round(device_s, 4), build_s=round(build_s, 4), wait_s=round(waited, 4))  # fmt: skip
        if not was_done and self.scheduler.is_done(i):
            self._emit("task_done", task=i, task_name=task.name, reason=self.scheduler.done_reason(i),
                       best_sec=self.scheduler.best_sec[i])  # fmt: skip
        self._check_hopeless()

    def _check_hopeless(self) -> None:
        """Stop the run when none of its candidates succeeded and ``config.hopeless_after`` or
        more failed over ``HOPELESS_TASKS`` tasks (all of them in a smaller job; a job of one
        task ends by that task's own limit).

        Raises:
            NothingMeasurable: with each failure class's first message; the failures are
                recorded, and the same command resumes the job once the cause is fixed.
        """
        failed = sum(self.errors.values())  # this run's: a resumed run starts from none
        tasks = len(self.tasks)
        limit = self.config.hopeless_after
        if (self._run_ok or not limit or tasks < 2 or failed < limit
                or len(self._run_failed_tasks) < min(HOPELESS_TASKS, tasks)):  # fmt: skip
            return
        causes = "; ".join(f"{c}: {m}" if m else c for c, m in self._run_failures.items())
        raise NothingMeasurable(
            f"the first {failed} candidates of {len(self._run_failed_tasks)} tasks all failed, none succeeded "
            f"({causes}). The device cannot measure this job as configured: check --target-arch, "
            "--build-timeout and the Ray workers' setup, then run the same command to resume "
            "(the failures are recorded and are not measured again)")

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
            space = search_spaces.create(task.mod, target, kind=kind, seed=self._space_seed)
            spaces.append(space)
            strategies.append(self._strategy(space, task, kind, seed=config.seed * 1009 + i * 31 + k))
        assert self.device_id is not None
        hashes = self._retrying("database", self.db.measured_hashes, task.workload_key, self.device_id, self.timing)
        ts = _TaskSearch(kinds, spaces, strategies, SpaceBandit(kinds), hashes=hashes)
        self._replay(task, ts)
        if i in self.seeded:
            self._seed(task, ts)
        for space, strategy in zip(spaces, strategies, strict=True):
            # A template's proven tiles are measured early whatever the search draws (those
            # measured already, by a resumed run, are dropped by the strategy).
            strategy.suggest(space.starts())
        self.searches[i] = ts
        return ts

    @property
    def _space_seed(self) -> int:
        return self.config.seed + 1

    def _strategy(self, space: search_spaces.SearchSpace, task: Task, kind: str, *, seed: int) -> SearchStrategy:
        # A study name that a rerun of the same job derives again, so Optuna resumes it.
        # Cold timings get studies of their own: a study's values are times of one mode.
        study = "/".join([self.model_name, self.device.fingerprint, task.workload_key, kind,
                          self.config.strategy, f"seed{self.config.seed}"]
                         + (["cold"] if self.timing == "cold" else []))  # fmt: skip
        options: dict[str, Any] = {"seed": seed, "storage_url": self.db.url.render_as_string(hide_password=False),
                                   "study_name": study}  # fmt: skip
        if self.config.propose_on == "cluster":
            spec = SpaceSpec.of(space, self.device.target_config, self._space_seed)
            options["applier"] = Applier(spec)
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
        counts = [0] * len(ts.kinds)
        best: list[float | None] = [None] * len(ts.kinds)
        stored = self._retrying("database", measured_results, self.db, task.workload_key, self.device_id,
                                self.timing)  # fmt: skip
        if self.config.fresh:
            # Other jobs' records are ignored; the job's own (a resumed run) still count.
            assert self.job_id is not None
            own = job_points(self.db, self.job_id, task.workload_key)
            stored = [r for r in stored if r[0] in own]
        rows, stale = _space_records(ts, stored)
        for k, cid, _, mean_sec, error in rows:
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
        if stale:
            logger.info("task %s: %d stored records are points of an earlier version of their space; "
                        "not told to the search", task.name, stale)

    def _seed(self, task: Task, ts: _TaskSearch) -> None:
        """Queue the fastest points of the task's records timed in the other mode, per space,
        to be measured first (a resumed job's strategies drop those it measured already)."""
        assert self.device_id is not None
        stored = self._retrying("database", measured_results, self.db, task.workload_key, self.device_id,
                                other_mode(self.timing))  # fmt: skip
        fastest: list[list[tuple[float, search_spaces.Point]]] = [[] for _ in ts.kinds]
        for k, _, point, mean_sec, error in _space_records(ts, stored)[0]:
            if error is None and mean_sec is not None:
                fastest[k].append((mean_sec, point))
        for k, found in enumerate(fastest):
            found.sort(key=lambda r: r[0])
            ts.strategies[k].suggest([point for _, point in found[: self.config.seed_points]])
        logger.info("task %s: seeded with %s", task.name, ", ".join(
            f"{kind} {min(len(f), self.config.seed_points)}" for kind, f in zip(ts.kinds, fastest, strict=True)))


def _space_records(
    ts: _TaskSearch, stored: list[tuple[str, float | None, str | None]]
) -> tuple[list[tuple[int, str, search_spaces.Point, float | None, str | None]], int]:
    """Stored records (point JSON, mean_sec, error_class) as ``(space index, candidate id,
    point, mean_sec, error_class)`` for the spaces of ``ts``, and how many were points of an
    earlier version of their space (left out)."""
    by_kind = {kind: k for k, kind in enumerate(ts.kinds)}
    rows = []
    stale = 0
    for text, mean_sec, error in stored:
        try:
            kind, cid = parse_record_point(text)
        except ValueError:
            continue
        k = by_kind.get(kind)
        if k is None:
            continue  # a template no longer registered or not applicable
        point = search_spaces.Point.from_json(cid)
        if ts.spaces[k].static_violation(point) is not None:
            # Measured in an earlier version of the space (a template gained a knob or a
            # tighter constraint): a population or study built on it would breed points of
            # the wrong shape. Its schedule stays usable by the compiler (traces).
            stale += 1
            continue
        rows.append((k, cid, point, mean_sec, error))
    return rows, stale


def tune_tasks(
    tasks: list[Task],
    device: Device,
    db: TuningDatabase,
    config: TuneConfig,
    *,
    model_name: str,
    on_event: EventSink | None = None,
) -> TuneSummary:
    """Tune ``tasks`` on ``device`` within ``config``'s trials cap and time budget.

    Proposing, building and timing overlap: while one batch is built and timed on the
    cluster, the next is proposed (``PIPELINE_DEPTH`` batches in flight). Every measurement,
    failed ones included, goes into ``db`` as its batch completes, so a killed job loses at
    most the batches in flight; a rerun tells its strategies every stored record, so no point
    is measured twice. A job of the same name (``config.name``) left unfinished is resumed
    (see :class:`TuningJob`); ``on_event`` receives its events (``tuner.progress``). The Ray
    cluster must already be connected.
    """
    return TuningJob(tasks, device, db, config, model_name=model_name, on_event=on_event).run()


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def _connection_lost(err: DatabaseError) -> bool:
    """Whether a database error says the server is out of reach (worth waiting for), not
    that the request was wrong."""
    from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError

    cause = err.__cause__
    if isinstance(cause, DisconnectionError | InterfaceError):
        return True
    if isinstance(cause, OperationalError):
        text = str(cause.orig or cause).lower()
        return cause.connection_invalidated or any(w in text for w in (
            "connection", "server closed", "timeout expired", "could not connect", "terminating",
            "database is locked", "unable to open", "disk i/o"))  # fmt: skip
    return False


def _pid(row: Any) -> int | None:
    """The process id a job's row names (None: an older row without one)."""
    try:
        pid = int(json.loads(row.config).get("pid", 0))
    except (ValueError, TypeError, AttributeError):
        return None
    return pid if pid > 0 else None


def _alive(row: Any) -> bool:
    """Whether the process that last ran a job may still run: on another host, assume so
    (its heartbeat decides); on this one, whether its process exists."""
    if row.host != socket.gethostname():
        return True
    pid = _pid(row)
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
