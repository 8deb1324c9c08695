"""Re-ranking a task's best records by timing them in interleaved rounds.

A job times each candidate once, at whatever moment its turn comes. On the project's
2-core cloud machines the speed of one kernel flips 1.3-1.6x from one second to the next
(``benchmarks/host_states.py``: the same build, timed 40 times in a row, slow in 0-98% of
the timings depending on the minute), so a task's stored best is often the record that met
a fast moment, and re-timed one by one the top records meet other moments again. Here the
``top`` fastest records of a task are built once and timed in ``rounds`` rounds, one cold
(or warm) timing of each record per round, so every record meets the same moments; each
record's timing is replaced by its per-round medians (:meth:`TuningDatabase.retime`) and
the compiler's pick follows. On a 2,048-trial ResNet-50 database of an AVX2 Zen 3, ``tune``'s
re-ranking (22 tasks, 58 s) made the model 10-13% faster in three interleaved runs against
the database as stored, ONNX Runtime and OpenVINO f32 (``INFERENCE_PRECISION_HINT`` f32, not
its bf16 default) beside (benchmarks/README.md,
"Re-ranking each task's best records in interleaved rounds").

The timing runs in the calling process, so only on a CPU of the same kind as the device the
records are for, on the node where the job's device actor times (the driver of a local
cluster), holding that node's timing lease as the actor does.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

from tuner.db import TuningDatabase
from tuner.graph.tasks import Task
from tuner.measure.builder import build_candidate
from tuner.measure.results import Timing
from tuner.measure.runner import TimingConfig, random_args
from tuner.measure.verify import arg_specs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reranked:
    """What re-ranking a task did.

    Attributes:
        stored_sec: the task's best time before (the stored best's mean).
        best_sec: its best time after (a re-timed record's mean over the rounds).
        retimed: records timed in the rounds and stored with those times.
        changed: whether another record is now the task's best.
    """

    stored_sec: float
    best_sec: float
    retimed: int
    changed: bool


def time_interleaved(libs: Sequence[tvm.runtime.Module], args: Sequence[tvm.runtime.Tensor], timing: TimingConfig,
                     rounds: int) -> list[list[float]]:  # fmt: skip
    """Per library, the median of each round's timing (seconds), the libraries timed in turn
    within every round; a round's timing is ``timing.repeat`` runs, as the job's device actor
    times a candidate (:meth:`TimingConfig.evaluator`)."""
    evaluators = [timing.evaluator(lib, "main", tvm.cpu(), timing.repeat) for lib in libs]
    out: list[list[float]] = [[] for _ in libs]
    for _ in range(rounds):
        for i, evaluate in enumerate(evaluators):
            out[i].append(statistics.median(float(s) for s in evaluate(*args).results))
    return out


def rerank_task(db: TuningDatabase, task: Task, device_id: int, target: tvm.target.Target, timing: Timing,
                config: TimingConfig, *, top: int = 4, rounds: int = 10, passes: int = 3, lease: Any = None,
                cpu_work: Callable[[], AbstractContextManager[Any]] | None = None) -> Reranked | None:  # fmt: skip
    """Time the ``top`` fastest records of ``task`` (mode ``timing``, timed as ``config``
    says) in interleaved rounds and store those times; repeat with the new top while its best
    is a record not timed in the rounds (at most ``passes`` times; a record is built once).
    None when the task has fewer than two records or they do not build.

    Args:
        lease: held around the rounds (``acquire()``/``release()``), e.g. the node's
            :class:`~tuner.measure.quiet.TimingLease`; None: no lease.
        cpu_work: a context manager held around the builds (the node's shared CPU lease).
    """
    # Every row comes through db.best, the gate: a record whose trace is off the allow-list
    # is never built nor loaded here (loading runs a library's constructors).
    first = db.best(task.workload_key, device_id, k=top, timing=timing)
    if len(first) < 2:
        return None
    host_args = random_args(arg_specs(task.mod))
    done: set[int] = set()
    loaded: dict[int, tvm.runtime.Module | None] = {}  # by record id; None: does not build
    rows = first
    with tempfile.TemporaryDirectory(prefix="nightshift-rerank-") as tmp:
        for _ in range(passes):
            if rows[0].id in done:
                break  # the best is a record timed in the rounds
            with cpu_work() if cpu_work is not None else nullcontext():
                for row in rows:
                    if row.id not in loaded:
                        loaded[row.id] = _load(task, row, target, Path(tmp))
            kept = [row for row in rows if loaded[row.id] is not None]
            libs = [loaded[row.id] for row in kept]
            if len(kept) < 2:
                break
            args = [tvm.runtime.tensor(a) for a in host_args]
            if lease is not None:
                lease.acquire()
            try:
                times = time_interleaved(libs, args, config, rounds)
            finally:
                if lease is not None:
                    lease.release()
            for row, secs in zip(kept, times, strict=True):
                db.retime(row.id, secs)
                done.add(row.id)
            rows = db.best(task.workload_key, device_id, k=top, timing=timing)
    if not done:
        return None
    best = rows[0]
    if best.id not in done:
        logger.warning("task %s: after %d passes its best is a record not timed in the rounds", task.name, passes)
    return Reranked(stored_sec=float(first[0].mean_sec), best_sec=float(best.mean_sec), retimed=len(done),
                    changed=best.id != first[0].id)  # fmt: skip


def _load(task: Task, row: Any, target: tvm.target.Target, tmp: Path) -> tvm.runtime.Module | None:
    """A record's program built as the job builds it and loaded, or None (logged)."""
    program = record_program(task, row.record_json)
    built = build_candidate(tvm.ir.save_json(program), dict(target.export())) if program else None
    if built is None or built.artifact is None:
        logger.warning("task %s: record %d does not build again; not re-ranked", task.name, row.id)
        return None
    path = tmp / f"{row.id}.so"
    path.write_bytes(built.artifact)
    return tvm_ffi.load_module(str(path), keep_module_alive=False)


def record_program(task: Task, record_json: str) -> tvm.IRModule | None:
    """The program a stored record makes of ``task`` (its trace replayed with its
    postprocessors, as it was built), or None when the trace does not replay."""
    import json

    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from tuner.db.validate import record_rejection

    # Rows from TuningDatabase.best passed the gate already; a caller with other text must too.
    refused = record_rejection(record_json)
    if refused is not None:
        logger.warning("task %s: a record refused (%s); not replayed", task.name, refused)
        return None
    try:
        record = TuningRecord.from_json(json.loads(record_json), Workload(task.mod))
        sch = Schedule(task.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except (RuntimeError, ValueError, TypeError) as err:  # tvm.error.TVMError is a RuntimeError
        logger.warning("task %s: a record does not replay (%s); not re-ranked", task.name, err)
        return None
    return sch.mod
