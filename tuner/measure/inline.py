"""Building and timing candidates in this process, without Ray: the ``inline`` measurer.

One worker thread takes the submitted candidates in order: it builds each
(:func:`~tuner.measure.builder.build_candidate`), checks it against the task's reference output
and times it (:class:`~tuner.measure.runner.CandidateRunner`), exactly as a Ray build task and a
device actor would, and resolves its future. A timing holds the measurer's lock, which the
driver's search also holds while it works (:meth:`InlineMeasurer.cpu_work`), so that no timing
shares its cores with the search.

What it does not do, by design: build and run timeouts, and isolation. A candidate that
crashes takes this process with it, and one that hangs hangs the job; use the ``ray``
measurer for anything long or untrusted. It is meant for tests that are not about Ray and
for a laptop without Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import tvm

from tuner.device import Device
from tuner.graph.tasks import Task
from tuner.measure.base import MeasureConfig, MeasureError, MeasureStats
from tuner.measure.builder import arg_specs, build_candidate, entry_name
from tuner.measure.cuda import reference_module
from tuner.measure.results import BuildResult, ErrorClass, Measurement, RunResult
from tuner.measure.runner import ArgSpec, CandidateRunner

logger = logging.getLogger(__name__)


@dataclass
class _Item:
    task_key: str
    entry: str
    mod_json: str
    time_it: bool
    future: Future | None  # None: the task's reference
    args: list[ArgSpec] | None = None


class _Lease:
    """The measurer's lock as a timing lease (``acquire``/``release``)."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock

    def acquire(self) -> dict[str, Any]:
        start = time.monotonic()
        self._lock.acquire()
        return {"waited_s": time.monotonic() - start}

    def release(self) -> None:
        self._lock.release()


class InlineMeasurer:
    """Builds, checks and times candidates in this process (see the module's docstring).

    Keeps the :class:`~tuner.measure.base.Measurer` contract; ``config``'s timeouts and
    cluster options do not apply, its ``timing`` does.
    """

    def __init__(self, device: Device, config: MeasureConfig | None = None) -> None:
        self.config = config or MeasureConfig()
        self.device = device
        self.stats = MeasureStats()
        device.use_threads()  # time on the target's cores, as a device actor does
        self._runner = CandidateRunner(device.kind, device.index)
        self._quiet = threading.RLock()
        self._cv = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._refs: dict[str, str | None] = {}  # task key -> reference error (None: ready)
        self._best: dict[str, float] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="nightshift-inline-measure", daemon=True)
        self._thread.start()

    # ----- the Measurer protocol -----

    def submit(self, task: Task, mods: Sequence[tvm.IRModule], *, time_them: bool = True) -> list[Future]:
        """Queue candidates of ``task``; each future resolves to a ``Measurement``."""
        entry = entry_name(task.mod)
        items = [_Item(task.workload_key, entry, tvm.ir.save_json(m), time_them, Future()) for m in mods]
        with self._cv:
            if self._closing:
                raise MeasureError("the measurer is closed")
            if time_them and task.workload_key not in self._refs:
                ref = reference_module(task.mod, self.device.target)
                self._refs[task.workload_key] = "pending"
                self._queue.append(_Item(task.workload_key, entry, tvm.ir.save_json(ref), False, None,
                                         args=arg_specs(task.mod)))  # fmt: skip
            if self.stats.first_submit is None:
                self.stats.first_submit = time.monotonic()
            self.stats.candidates += len(items)
            self._queue.extend(items)
            self._cv.notify_all()
        return [i.future for i in items if i.future is not None]

    @contextlib.contextmanager
    def cpu_work(self) -> Iterator[None]:
        """Hold the block apart from timings (the driver's search)."""
        with self._quiet:
            yield

    def alive(self) -> bool:
        """Always: this process is the infrastructure."""
        return not self._closing

    def timing_lease(self) -> _Lease:
        """The measurer's own lock: a timing outside it never overlaps one of its timings."""
        return _Lease(self._quiet)

    def reset_stats(self) -> None:
        """Start counting anew."""
        with self._cv:
            self.stats = MeasureStats()

    def devices_info(self) -> list[dict[str, Any]]:
        """The one device this measurer times on, as a device actor describes itself."""
        return [self._runner.info() | {"fingerprint": self.device.fingerprint}]

    def close(self) -> None:
        """Stop after the candidate in progress; the others resolve as ``LOST``."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=600)
        with self._cv:
            left, self._queue = list(self._queue), deque()
        for item in left:
            self._finish(item, BuildResult(None, 0.0), RunResult(error_class=ErrorClass.LOST,
                                                                 error_msg="measurer closed"))

    def __enter__(self) -> InlineMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- the worker thread -----

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closing and not self._queue:
                    self._cv.wait()
                if self._closing:
                    return
                item = self._queue.popleft()
            try:
                self._one(item)
            except Exception as err:  # any fault is this candidate's, never the measurer's
                logger.exception("inline measurement failed")
                self._finish(item, BuildResult(None, 0.0), RunResult(error_class=ErrorClass.RUN_ERROR,
                                                                     error_msg=f"{type(err).__name__}: {err}"))

    def _one(self, item: _Item) -> None:
        build = build_candidate(item.mod_json, self.device.target_config)
        with self._cv:
            self.stats.build_s += build.build_sec
            self.stats.built += int(build.ok)
        if item.future is None:  # the task's reference
            error = f"reference: {build.error_msg}" if not build.ok else None
            if error is None:
                assert build.artifact is not None and item.args is not None
                ref = self._runner.set_reference(item.task_key, build.artifact, item.entry, item.args)
                error = None if ref.ok else ref.error_msg
            self._refs[item.task_key] = error
            return
        if not build.ok or not item.time_it:
            run = RunResult(error_class=build.error_class, error_msg=build.error_msg) if not build.ok else RunResult()
            self._finish(item, build, run)
            return
        error = self._refs.get(item.task_key)
        if error is not None:
            self._finish(item, build, RunResult(error_class=ErrorClass.RUN_ERROR, error_msg=error))
            return
        assert build.artifact is not None
        with self._quiet:
            run = self._runner.measure(item.task_key, build.artifact, item.entry, self.config.timing,
                                       best_sec=self._best.get(item.task_key))  # fmt: skip
        with self._cv:
            self.stats.device_busy_s += run.busy_s
            if run.ok:
                self.stats.timed += 1
        if run.ok and not run.early_stopped and run.median is not None:
            self._best[item.task_key] = min(run.median, self._best.get(item.task_key, run.median))
        self._finish(item, build, dataclasses.replace(run, device_fingerprint=self.device.fingerprint))

    def _finish(self, item: _Item, build: BuildResult, run: RunResult) -> None:
        m = Measurement(build, run)
        with self._cv:
            self.stats.finished(m)
        if item.future is not None and not item.future.done():
            item.future.set_result(m)
