"""Confirming a task's best: its fastest few records timed again, side by side.

A task's stored best is the fastest of the ~50-500 timings its job took, each a handful of
noisy runs, so it is biased low: on bf16 ResNet-50 the stored best of 8 of the 10 heaviest
tasks lost to another of its task's six fastest records when the six were timed again
side by side (benchmarks/README.md, "The data in a cold timing"). At the end of a job
:func:`confirm_task` times the ``top`` fastest records of a task again, with the job's
measurer and timing, stores those times in place of the old ones
(:meth:`TuningDatabase.retime`), and repeats for records that the new times let into the
top (up to ``rounds``), so the record the compiler picks is ranked by a time taken beside
its rivals'.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from tuner.db import TuningDatabase
from tuner.measure.ray_measure import RayMeasurer
from tuner.measure.results import Timing
from tuner.tasks import Task

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Confirmation:
    """What confirming a task did.

    Attributes:
        stored_sec: the task's best time before (the stored best's mean).
        best_sec: its best time after.
        retimed: records timed again and stored with their new times.
        failed: records whose new timing failed (they keep their old times).
        changed: whether another record is now the task's best.
    """

    stored_sec: float
    best_sec: float
    retimed: int
    failed: int
    changed: bool


def record_program(task: Task, record_json: str) -> tvm.IRModule | None:
    """The program a stored record makes of ``task`` (its trace replayed, postprocessors
    included, as it was built), or None when the trace does not replay."""
    try:
        record = TuningRecord.from_json(json.loads(record_json), Workload(task.mod))
        sch = Schedule(task.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except (RuntimeError, ValueError, TypeError) as err:  # tvm.error.TVMError is a RuntimeError
        logger.warning("task %s: a record does not replay (%s); not confirmed", task.name, err)
        return None
    return sch.mod


def confirm_task(db: TuningDatabase, measurer: RayMeasurer, task: Task, device_id: int, timing: Timing,
                 top: int, *, rounds: int = 2) -> Confirmation | None:  # fmt: skip
    """Time the ``top`` fastest records of ``task`` on ``device_id`` (mode ``timing``) again and
    store the new times; None when the task has fewer than two such records."""
    first = db.best(task.workload_key, device_id, k=top, timing=timing)
    if len(first) < 2:
        return None
    done: set[int] = set()
    failed = 0
    rows = first
    for _ in range(rounds):
        fresh = [r for r in rows if r.id not in done]
        if not fresh:
            break
        programs = [(r, record_program(task, r.record_json)) for r in fresh]
        programs = [(r, p) for r, p in programs if p is not None]
        done.update(r.id for r in fresh)
        results = measurer.measure(task, [p for _, p in programs]) if programs else []
        for (row, _), m in zip(programs, results, strict=True):
            if m.error_class is None and m.run.run_secs and not m.run.early_stopped:
                db.retime(row.id, m.run.run_secs)
            else:
                failed += 1
                logger.warning("task %s: record %d timed again failed (%s); it keeps its old time",
                               task.name, row.id, m.error_msg or m.error_class)  # fmt: skip
        rows = db.best(task.workload_key, device_id, k=top, timing=timing)
    best = rows[0]
    return Confirmation(
        stored_sec=float(first[0].mean_sec), best_sec=float(best.mean_sec), retimed=len(done) - failed,
        failed=failed, changed=best.id != first[0].id,
    )  # fmt: skip
