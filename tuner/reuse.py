"""What the database already holds for a job's tasks on its device, and the rule that follows.

A task the database has many good records of on this device (any job, any teammate) is
skipped; one with some is warm-started (its strategies told those records, the scheduler its
best); ``--fresh`` ignores other jobs' records (the job's own, when it resumes, still count).
Only records of the job's timing mode count: a task tuned warm is not yet tuned cold. A
task with none in the job's mode but good ones in the other is seeded: the fastest points of
those (``SEED_POINTS`` per space) are measured again first, then the search goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import distinct, func, select

from tuner.db import TuningDatabase
from tuner.db.schema import RecordRow, WorkloadRow
from tuner.measure.results import Timing

#: Points of the other timing mode's records measured first, per space of a task.
SEED_POINTS = 8


@dataclass(frozen=True)
class TaskHistory:
    """A workload's records on one device."""

    records: int = 0
    ok: int = 0
    jobs: int = 0
    best_sec: float | None = None
    #: Records of the job asking (a resumed job's earlier runs) and their best.
    own: int = 0
    own_best_sec: float | None = None


def task_histories(db: TuningDatabase, device_id: int, job_id: int, keys: list[str],
                   timing: Timing = "warm") -> dict[str, TaskHistory]:  # fmt: skip
    """:class:`TaskHistory` of each workload key, from its records timed in ``timing`` mode
    (absent keys have none): two grouped SELECTs, then each best through the gate
    (:meth:`TuningDatabase.best`)."""
    ok = RecordRow.error_class.is_(None) & RecordRow.mean_sec.is_not(None)
    base = (select(WorkloadRow.key).join(RecordRow, RecordRow.workload_id == WorkloadRow.id)
            .where(WorkloadRow.key.in_(keys), RecordRow.device_id == device_id, RecordRow.timing == timing)
            .group_by(WorkloadRow.key))  # fmt: skip
    every = base.add_columns(func.count(RecordRow.id), func.count(RecordRow.mean_sec).filter(ok),
                             func.count(distinct(RecordRow.job_id)),
                             func.min(RecordRow.mean_sec).filter(ok))  # fmt: skip
    own = base.add_columns(func.count(RecordRow.id), func.min(RecordRow.mean_sec).filter(ok)).where(
        RecordRow.job_id == job_id)  # fmt: skip
    with db.session(write=False) as s:
        mine = {k: (int(n), b) for k, n, b in s.execute(own)}
        every_row = list(s.execute(every))
    out = {}
    for key, n, n_ok, jobs, best in every_row:
        o = mine.get(key, (0, None))
        # The bests as the gate leaves them: a time set by SQL below the floor (or with a
        # refused trace) would otherwise set where the scheduler starts.
        if best is not None:
            best = _gated_best(db, key, device_id, timing)
        own_best = _gated_best(db, key, device_id, timing, job_id) if o[1] is not None else None
        out[key] = TaskHistory(int(n), int(n_ok), int(jobs), best, o[0], own_best)
    return out


def _gated_best(db: TuningDatabase, key: str, device_id: int, timing: Timing,
                job_id: int | None = None) -> float | None:  # fmt: skip
    rows = db.best(key, device_id, origin=None, timing=timing, job_id=job_id)
    return float(rows[0].mean_sec) if rows else None


def other_mode(timing: Timing) -> Timing:
    """The timing mode a job of mode ``timing`` may seed its tasks from."""
    return "warm" if timing == "cold" else "cold"


def seed_line(h: TaskHistory, timing: Timing, points: int = SEED_POINTS) -> str | None:
    """The line a ``new`` task prints when it is seeded with ``points`` points per space from
    ``h``, the records of the other mode than ``timing``; None when they hold nothing to seed
    from."""
    if not h.ok or h.best_sec is None:
        return None
    other = other_mode(timing)
    return (f"no {timing}-timed records; {h.ok} good {other}-timed ones (best {h.best_sec * 1e3:.3g} ms): "
            f"their {points} fastest points per space are measured {timing} first")


def job_points(db: TuningDatabase, job_id: int, workload_key: str) -> set[str]:
    """Point JSONs a job recorded for a workload (what a ``--fresh`` job replays on resume)."""
    stmt = (select(RecordRow.point).join(WorkloadRow, WorkloadRow.id == RecordRow.workload_id)
            .where(RecordRow.job_id == job_id, WorkloadRow.key == workload_key))  # fmt: skip
    with db.session(write=False) as s:
        return set(s.scalars(stmt))


def rule(h: TaskHistory, *, skip_after: int, fresh: bool) -> tuple[str, str]:
    """``(decision, the line the job prints)``; decision is ``new``, ``warm``, ``skip`` or ``fresh``.

    Skipped: at least ``skip_after`` successful records on this device (``0``: never skip).
    """
    others = h.records - h.own
    if others == 0:
        return "new", ""
    best = "no successful record" if h.best_sec is None else f"best {h.best_sec * 1e3:.3g} ms"
    what = f"{h.records} records from {h.jobs} job{'s' if h.jobs != 1 else ''}, {best}"
    if fresh:
        return "fresh", f"{what}; ignored (--fresh)"
    # Only with a best that passes the read gate: successes whose times no device reaches count
    # in ``ok`` (a SQL count) but must not stop a task from being tuned.
    if skip_after and h.ok >= skip_after and h.best_sec is not None:
        return "skip", f"{what}; skipped (>= {skip_after} good records)"
    return "warm", f"{what}; warm start"
