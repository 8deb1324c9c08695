"""What the morning report and ``nightshift jobs`` read from the tuning database.

Read-only queries over jobs and their records; nothing here writes. A job is found by its
name (``tune --job NAME``, schema 4) or by its id; a ``running`` job whose heartbeat (or,
for jobs that write none, last update) is older than :data:`DEAD_AFTER` is shown as ``dead``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select

from tuner.db import TuningDatabase
from tuner.db.schema import DeviceRow, JobRow, RecordRow, WorkloadRow
from tuner.errors import UserInputError
from tuner.progress import in_plan, per_operator, preferred_plan

logger = logging.getLogger(__name__)

#: A running job writes its heartbeat at least every minute; five without one means it died.
DEAD_AFTER = timedelta(minutes=5)


def _utc(value: datetime | None) -> datetime | None:
    # SQLite and PostgreSQL's plain DateTime give naive datetimes; Nightshift writes UTC.
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class JobInfo:
    """One job as ``nightshift jobs`` lists it."""

    id: int
    name: str | None
    model: str
    device: str
    device_kind: str
    device_arch: str
    fingerprint: str
    state: str
    trials_done: int
    trials_total: int
    elapsed_sec: float
    time_budget_sec: float | None
    created_at: datetime
    updated_at: datetime
    heartbeat_at: datetime | None
    host: str | None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The name a user resumes it by, else ``#id``."""
        return self.name or f"#{self.id}"

    @property
    def timing(self) -> str:
        """``records.timing`` of the job's measurements (``"warm"`` for jobs older than the column)."""
        return "cold" if self.config.get("timing") == "cold" else "warm"

    @property
    def last_alive(self) -> datetime:
        """The heartbeat, or the last update for jobs that write no heartbeat."""
        return self.heartbeat_at or self.updated_at

    def shown_state(self, now: datetime | None = None) -> str:
        """The state, with a ``running`` job whose heartbeat stopped shown as ``dead``."""
        now = now or datetime.now(UTC)
        if self.state == "running" and now - self.last_alive > DEAD_AFTER:
            return "dead"
        return self.state

    @property
    def wall_sec(self) -> float:
        """Tuning time spent: ``elapsed_sec`` where the job keeps it, else first to last update."""
        if self.elapsed_sec:
            return float(self.elapsed_sec)
        return max((self.updated_at - self.created_at).total_seconds(), 0.0)


def _job_query():
    return select(JobRow, DeviceRow).join(DeviceRow, DeviceRow.id == JobRow.device_id)


def _info(job: JobRow, device: DeviceRow) -> JobInfo:
    try:
        config = json.loads(job.config or "{}")
    except ValueError:
        config = {}
    name = device.kind if device.kind == "cpu" else str(config.get("device") or device.kind)
    created = _utc(job.created_at) or datetime.now(UTC)
    return JobInfo(
        id=job.id, name=job.name, model=job.model, device=str(config.get("device") or name),
        device_kind=device.kind, device_arch=device.arch, fingerprint=device.fingerprint, state=job.state,
        trials_done=job.trials_done, trials_total=job.trials_total, elapsed_sec=float(job.elapsed_sec or 0.0),
        time_budget_sec=job.time_budget_sec, created_at=created, updated_at=_utc(job.updated_at) or created,
        heartbeat_at=_utc(job.heartbeat_at), host=job.host, config=config if isinstance(config, dict) else {},
    )  # fmt: skip


def list_jobs(db: TuningDatabase) -> list[JobInfo]:
    """Every job, newest first."""
    with db.session(write=False) as s:
        rows = s.execute(_job_query().order_by(JobRow.id.desc())).all()
        return [_info(job, device) for job, device in rows]


def find_job(db: TuningDatabase, name_or_id: str) -> JobInfo:
    """The newest job named ``name_or_id``, else the job with that id.

    Raises:
        UserInputError: no such job (the message lists a few that exist).
    """
    with db.session(write=False) as s:
        row = s.execute(_job_query().where(JobRow.name == name_or_id).order_by(JobRow.id.desc()).limit(1)).first()
        if row is None and name_or_id.lstrip("#").isdigit():
            row = s.execute(_job_query().where(JobRow.id == int(name_or_id.lstrip("#")))).first()
        if row is None:
            known = s.execute(select(JobRow.id, JobRow.name).order_by(JobRow.id.desc()).limit(5)).all()
            hint = ", ".join(name or f"#{i}" for i, name in known) or "none: run tune first"
            raise UserInputError(f"no job named {name_or_id!r} in the database (newest: {hint}; see nightshift jobs)")
        return _info(*row)


@dataclass
class Measurement:
    """One record of the job, as the report plots it."""

    at_sec: float
    mean_sec: float | None
    error_class: str | None
    build_sec: float | None
    run_wall_sec: float | None
    run_secs_sum: float


@dataclass
class TaskData:
    """One task's records in the job and what the database knew of it before."""

    workload_key: str
    name: str
    flops: float
    weight: float | None = None
    #: Layout-variant group (``Task.choice``): the model runs one task of a group.
    choice: str = ""
    #: Uniform layout plans running the task (``Task.plans``); empty: every plan.
    plans: tuple[int, ...] = ()
    records: list[Measurement] = field(default_factory=list)
    #: Best mean of this device's records written before the job started (any job), if any.
    best_before: float | None = None
    #: Best mean of this device's records now (what the compiler picks), if any.
    best_now: float | None = None
    #: Whether the compiled plan runs this task: False for a task of a layout alternative the
    #: artifact's plan did not take (``--layout auto`` tunes every conv in each candidate layout).
    in_plan: bool = True

    @property
    def operator(self) -> str:
        """The operator the task is one variant of: its layout group, else the task itself."""
        return self.choice or self.workload_key

    @property
    def best_end(self) -> float | None:
        """Best mean at the end of the job: before it or of its own records (the curve's last value)."""
        known = [b for b in (self.best_before, self.best_job) if b is not None]
        return min(known) if known else None

    @property
    def best_job(self) -> float | None:
        """Best mean among this job's records."""
        ok = [m.mean_sec for m in self.records if m.mean_sec is not None]
        return min(ok) if ok else None

    @property
    def errors(self) -> int:
        """Failed records of this job."""
        return sum(1 for m in self.records if m.error_class is not None)

    @property
    def gflops(self) -> float | None:
        """FLOPs over the best latency known on the device."""
        best = self.best_now or self.best_job
        return self.flops / best / 1e9 if best and self.flops else None


#: Which best :meth:`JobData.estimated_latency` takes: the database's now, before the job, or
#: at the job's end (before it or its own records: what its curve ends at), or the job's own.
_PICK: dict[str, Callable[[TaskData], float | None]] = {
    "now": lambda t: t.best_now, "before": lambda t: t.best_before, "end": lambda t: t.best_end,
    "job": lambda t: t.best_job}


@dataclass(frozen=True)
class TimeSpent:
    """Where the job's wall time went, in seconds.

    Builds run in parallel on the cluster's CPUs and overlap the timings, so ``build`` is
    CPU-seconds and ``rest`` (wall minus timing minus builds) is a lower bound of the time
    spent searching, queueing and idle.
    """

    wall: float
    build: float
    timing: float
    timing_is_lower_bound: bool

    @property
    def rest(self) -> float:
        """Wall time not accounted for by builds or timings (at least 0)."""
        return max(self.wall - self.build - self.timing, 0.0)


@dataclass
class JobData:
    """Everything the report shows of one job."""

    job: JobInfo
    tasks: list[TaskData]
    errors: Counter[str]
    time: TimeSpent
    weights_from: str
    #: Where the plan's tasks came from (empty: every task of the job, layout variants grouped).
    plan_from: str = ""

    @property
    def num_records(self) -> int:
        """Records the job wrote."""
        return sum(len(t.records) for t in self.tasks)

    def _costs(self, best: Callable[[TaskData], float | None], *,
               unknown_weight: float | None = None) -> dict[str, tuple[TaskData | None, float | None]]:
        """Per operator of the plan, the task that counts and its weight × ``best`` (None: none known).

        A task of a layout alternative outside the plan never counts; layout variants of one
        operator (one ``choice``) count once, the fastest that has a best: what ``--layout
        auto`` picks for a conv when transforms cost nothing. One definition for the header,
        the shares and the curve, so that they add up."""
        out: dict[str, tuple[TaskData | None, float | None]] = {}
        for t in self.tasks:
            if not t.in_plan:
                continue
            b, w = best(t), t.weight if t.weight is not None else unknown_weight
            cost = None if b is None or w is None else w * b
            old = out.get(t.operator)
            if old is None or old[1] is None or (cost is not None and cost < old[1]):
                out[t.operator] = (t if cost is not None or old is None else old[0], cost)
        return out

    def operator_costs(self, use: str = "now") -> dict[str, float | None]:
        """Weight × best of each operator of the plan (``use`` as :meth:`estimated_latency`)."""
        return {op: c for op, (_t, c) in self._costs(_PICK[use]).items()}

    def estimated_latency(self, use: str = "now") -> float | None:
        """Σ weight × best over the plan's operators (``use``: ``now``, ``before``, ``end``, ``job``),
        None if an operator lacks one.

        Layout variants of one operator count once, the fastest that has a best (the layout
        transforms a variant implies are left out); None if none of a group has one."""
        costs = list(self.operator_costs(use).values())
        return None if not costs or any(c is None for c in costs) else sum(costs)  # type: ignore[arg-type]

    def shares(self) -> dict[str, float]:
        """Each counted task's share of Σ weight × best now over the plan's measured operators
        (by workload key; they sum to 1). Tasks outside the plan, slower layout variants and
        tasks without a record have none. Unknown weights count 1."""
        costs = {t.workload_key: c for t, c in self._costs(lambda t: t.best_now, unknown_weight=1.0).values()
                 if t is not None and c is not None}  # fmt: skip
        total = sum(costs.values())
        return {k: c / total for k, c in costs.items()} if total > 0 else {}

    @property
    def unmeasured_operators(self) -> int:
        """Operators of the plan without any best on the device (they run TVM's default schedule)."""
        return sum(1 for _t, c in self._costs(lambda t: t.best_now, unknown_weight=1.0).values() if c is None)

    def estimate_curve(self, operators: Collection[str] | None = None, *,
                       own: bool = False) -> list[tuple[float, float]]:
        """``(seconds since the job started, Σ weight × best so far)`` after each of the job's
        measurements, over the plan's operators (or those of ``operators``), from when every one
        of them has a best; it ends at :meth:`estimated_latency` ``("end")``, or with ``own``
        (the job's records only, not the database's bests before it) at ``("job")``."""
        keep = None if operators is None else set(operators)
        tasks = [t for t in self.tasks if t.in_plan and t.weight is not None and (keep is None or t.operator in keep)]
        ops = {t.operator for t in tasks}
        if not tasks or (keep is not None and ops != keep):
            return []
        if keep is None and ops != {t.operator for t in self.tasks if t.in_plan}:
            return []  # an operator of the plan has no weight: no estimate to draw
        best: dict[str, float | None] = {t.workload_key: None if own else t.best_before for t in tasks}
        events = sorted((m.at_sec, t.workload_key, m.mean_sec) for t in tasks for m in t.records if m.mean_sec)
        out: list[tuple[float, float]] = []
        for at, key, sec in events:
            old = best[key]
            best[key] = sec if old is None else min(old, sec)
            costs = per_operator((t.operator, None if best[t.workload_key] is None
                                  else t.weight * best[t.workload_key]) for t in tasks)  # type: ignore[operator]
            if all(c is not None for c in costs):
                out.append((at, sum(costs)))  # type: ignore[arg-type]
        return out


def job_data(db: TuningDatabase, job: JobInfo, *, artifact: dict[str, Any] | None = None) -> JobData:
    """The job's records per task, the database's bests before and now, errors and time spent.

    Task weights (how often a task runs per inference) come from the job's configuration
    (``tasks``), else from the artifact's metadata, else are unknown (the report says so).
    """
    weights, choices, source = _weights(job.config.get("tasks"), "the job's configuration")
    plans = _plans(job.config.get("tasks"))
    if not weights and artifact is not None:
        weights, choices, source = _weights(artifact.get("tasks"), "the artifact's metadata")
    if not weights:
        source = ""
    tasks: dict[str, TaskData] = {}
    errors: Counter[str] = Counter()
    build = timing = wall_timing = 0.0
    has_wall = True
    last_at = 0.0
    with db.session(write=False) as s:
        device_id = s.scalar(select(JobRow.device_id).where(JobRow.id == job.id))
        rows = s.execute(
            select(WorkloadRow.key, WorkloadRow.name, WorkloadRow.flops, RecordRow.created_at, RecordRow.mean_sec,
                   RecordRow.error_class, RecordRow.build_sec, RecordRow.run_wall_sec, RecordRow.run_secs)
            .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
            .where(RecordRow.job_id == job.id)
            .order_by(RecordRow.created_at, RecordRow.id)
        ).all()  # fmt: skip
        for key, name, flops, created, mean, error, b_sec, w_sec, run_secs in rows:
            t = tasks.setdefault(key, TaskData(key, name, float(flops or 0.0), weights.get(key), choices.get(key, ""),
                                               plans.get(key, ())))
            at = ((_utc(created) or job.created_at) - job.created_at).total_seconds()
            last_at = max(last_at, at)
            try:
                secs = sum(float(x) for x in json.loads(run_secs or "[]"))
            except (ValueError, TypeError):
                secs = 0.0
            t.records.append(Measurement(at, mean, error, b_sec, w_sec, secs))
            if error is not None:
                errors[error] += 1
            build += b_sec or 0.0
            timing += secs
            wall_timing += w_sec or 0.0
            has_wall = has_wall and w_sec is not None
        for key, weight in weights.items():
            if key not in tasks:
                w = s.execute(select(WorkloadRow.name, WorkloadRow.flops).where(WorkloadRow.key == key)).first()
                if w is not None:
                    tasks[key] = TaskData(key, w.name, float(w.flops or 0.0), weight, choices.get(key, ""),
                                          plans.get(key, ()))
        plan, plan_from = _plan(artifact, job)
        for key, weight in plan.items():
            if key not in tasks:  # a task of the compiled plan the job's configuration does not list
                w = s.execute(select(WorkloadRow.name, WorkloadRow.flops).where(WorkloadRow.key == key)).first()
                if w is not None:
                    tasks[key] = TaskData(key, w.name, float(w.flops or 0.0), weights.get(key, weight))
        if plan:
            for key, t in tasks.items():
                t.in_plan = key in plan
        if device_id is not None and tasks:
            _bests(s, tasks, device_id, job)
        if not plan:
            # No compiled plan given: the layout plan the job's bests favour stands in for it, so
            # the other plans' own operators are not added to the model's time.
            favoured = preferred_plan((t.plans, t.choice, t.best_now) for t in tasks.values())
            for t in tasks.values():
                t.in_plan = in_plan(t.plans, t.choice, favoured)
    wall = job.elapsed_sec or max(last_at, job.wall_sec)
    spent = TimeSpent(wall, build, wall_timing if has_wall and rows else timing, not (has_wall and rows))
    ordered = sorted(tasks.values(), key=lambda t: (not t.in_plan, -(t.weight or 1.0) * (t.best_now or t.best_job
                                                                                          or 0.0)))
    return JobData(job, ordered, errors, spent, source, plan_from)


def _plan(artifact: dict[str, Any] | None, job: JobInfo) -> tuple[dict[str, float], str]:
    """The compiled plan's tasks (workload key: weight) from the artifact of the job's model, and
    where they came from; empty without one.

    The artifact lists the tasks its build runs, one per operator in the layout the plan gave
    it; the job tunes each conv in every candidate layout, and also the other layouts' own
    pooling and transform tasks, which the plan never runs."""
    if artifact is None or artifact.get("model") not in (None, job.model):
        return {}, ""
    weights, _choices, _ = _weights(artifact.get("tasks"), "")
    if not weights:
        return {}, ""
    return weights, "the artifact's tasks (the plan it was compiled with)"


def _plans(tasks: Any) -> dict[str, tuple[int, ...]]:
    """The uniform layout plans of each task (``Task.plans``) by workload key, from a job's tasks."""
    if not isinstance(tasks, list):
        return {}
    return {str(t["workload_key"]): tuple(int(r) for r in t["plans"]) for t in tasks
            if isinstance(t, dict) and "workload_key" in t and isinstance(t.get("plans"), list) and t["plans"]}


def _weights(tasks: Any, source: str) -> tuple[dict[str, float], dict[str, str], str]:
    """Weights and layout-variant groups by workload key, from a job's or artifact's tasks."""
    if not isinstance(tasks, list):
        return {}, {}, source
    out: dict[str, float] = {}
    choices: dict[str, str] = {}
    for t in tasks:
        if isinstance(t, dict) and "workload_key" in t and isinstance(t.get("weight"), int | float):
            out[str(t["workload_key"])] = float(t["weight"])
            if t.get("choice"):
                choices[str(t["workload_key"])] = str(t["choice"])
    return out, choices, source


def _bests(s, tasks: dict[str, TaskData], device_id: int, job: JobInfo) -> None:
    # Bests of the job's timing mode only: a warm time is lower than a cold one of the same program.
    ok = and_(RecordRow.device_id == device_id, RecordRow.timing == job.timing, RecordRow.error_class.is_(None),
              RecordRow.mean_sec.is_not(None))  # fmt: skip
    base = (select(WorkloadRow.key, func.min(RecordRow.mean_sec))
            .join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
            .where(ok, WorkloadRow.key.in_(list(tasks)))
            .group_by(WorkloadRow.key))  # fmt: skip
    for key, best in s.execute(base).all():
        tasks[key].best_now = best
    # Records of other jobs written before this one started (a resumed run's own records
    # have this job's id, whatever their time).
    created = job.created_at.replace(tzinfo=None)
    before = base.where(RecordRow.created_at < created,
                        or_(RecordRow.job_id.is_(None), RecordRow.job_id != job.id))  # fmt: skip
    for key, best in s.execute(before).all():
        tasks[key].best_before = best
