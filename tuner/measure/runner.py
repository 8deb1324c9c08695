"""Timing built candidates on a device and checking their outputs against a reference.

Needs only the TVM runtime (the device actor runs with ``TVM_USE_RUNTIME_LIB=1``): artifacts
arrive as bytes of a shared library. Import nothing from the compiler side here.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from tuner.cuda_runtime import load_cuda_runtime
from tuner.errors import CudaToolchainError
from tuner.measure.cuda import context_fatal
from tuner.measure.results import ErrorClass, RunResult, Timing, relative_spread

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArgSpec:
    """Shape and dtype of one argument of a task's PrimFunc."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, kw_only=True)
class TimingConfig:
    """How to time a candidate.

    The first (checked) call warms the caches up; then ``repeat`` repeats, each made of as
    many calls as it takes to last ``min_repeat_ms``. If the repeats' spread (IQR / median)
    exceeds ``max_spread``, up to ``max_remeasure`` more rounds are taken and all are kept.
    With ``flush_cache`` (CPU) every repeat starts with the inputs flushed from the caches
    and counts one call. A candidate whose short probe is more than ``hopeless_factor`` times
    the task's best so far is stopped there and recorded with the probe only (0 disables).
    Timing a candidate takes about ``max_timing_s`` at most: a slow candidate (the first of a
    task has no best to be compared with) gets fewer repeats, at least one, and no extra rounds
    that would not fit, so it is recorded with its real time instead of running into the run
    timeout (0 disables). Probe calls that each last ``min_repeat_ms`` are repeats of the
    same kind (one call each) and count among the ``repeat``. Extra rounds are taken only
    for a candidate whose fastest repeat is within ``contender_factor`` of the task's best
    (0: for every candidate): a slower one cannot become the best, and its median ranks it.
    """

    repeat: int = 5
    min_repeat_ms: int = 20
    flush_cache: bool = False
    max_spread: float = 0.05
    max_remeasure: int = 2
    hopeless_factor: float = 4.0
    probe: int = 3
    cooldown_ms: int = 0
    max_timing_s: float = 10.0
    contender_factor: float = 1.25

    @classmethod
    def of_mode(cls, mode: Timing) -> TimingConfig:
        """The timing ``tune --timing MODE`` asks for: the defaults, or for ``"cold"`` the
        caches flushed before each of 10 one-call runs (a flushed run cannot be repeated
        within one call, so it takes more runs for the same spread)."""
        return cls(flush_cache=True, repeat=10) if mode == "cold" else cls()

    def evaluator(self, lib, entry: str, dev, repeat: int, *, flush: bool | None = None):
        """TVM's ``time_evaluator`` of ``lib[entry]`` timed this way, ``repeat`` runs: with the
        caches flushed (``flush``, default ``flush_cache``), one call a run after TVM's flush of
        every argument but the data; else calls lasting ``min_repeat_ms`` a run."""
        flush = self.flush_cache if flush is None else flush
        return lib.time_evaluator(
            entry, dev, number=1, repeat=repeat,
            min_repeat_ms=0 if flush else self.min_repeat_ms,
            cooldown_interval_ms=self.cooldown_ms,
            f_preproc="cache_flush_cpu_non_first_arg" if flush else "",
        )  # fmt: skip

    def mode(self, device_kind: str) -> Timing:
        """How timings taken with this config on a ``device_kind`` device are recorded:
        ``"cold"`` only where the caches are flushed (a CPU), else ``"warm"``."""
        return "cold" if self.flush_cache and device_kind == "cpu" else "warm"


@dataclass(frozen=True)
class Reference:
    """How to compute a task's reference output: its unscheduled build and arguments.

    ``artifact`` is a one-element list holding the ObjectRef of the bytes, so that Ray does
    not fetch them with every call; the actor fetches them only when it lacks the reference.
    """

    artifact: list[Any]
    entry: str
    args: list[ArgSpec] = field(default_factory=list)


def tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for comparing a candidate's output to the reference.

    ``atol`` is relative to the largest magnitude in the reference output, since a reordered
    float reduction errs in proportion to the values summed, not to each output element.
    """
    return {"float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2), "float64": (1e-7, 1e-9)}.get(
        dtype, (1e-4, 1e-4) if dtype == "float32" else (0.0, 0.0)
    )


def is_float(dtype) -> bool:
    """Whether ``dtype`` is a float, ml_dtypes' ``bfloat16`` and ``float8_*`` included (numpy
    gives those the kind ``V``, which an exact comparison would wrongly treat as bits)."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat", "float"))


def random_args(args: list[ArgSpec], seed: int = 0) -> list[np.ndarray]:
    """Deterministic inputs for a task: floats in [-1, 1); integers 0 or 1 (safe indices)."""
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        if np.dtype(a.dtype).kind in "iub":
            out.append(rng.integers(0, 2, size=a.shape).astype(a.dtype))
        else:
            out.append(rng.uniform(-1, 1, size=a.shape).astype(a.dtype))
    return out


#: 8-bit integer outputs are requantized: ``round(acc * s + b)`` in float32, which a
#: candidate may compute with other float operations than the reference (a fused
#: multiply-add, the scales folded), so a value within an ulp of a rounding tie may land
#: one step apart. Up to this fraction of them may differ by 1; a wrong schedule (a dropped
#: tap, a misplaced tile) moves many more, or by more. int32 (and wider) stays exact.
REQUANTIZED_TIES = 1e-3


def compare(got: np.ndarray, want: np.ndarray) -> str | None:
    """None if ``got`` matches ``want`` within the dtype's tolerance, else what differs."""
    rtol, atol = tolerance(str(want.dtype))
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if not is_float(want.dtype):
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        bad = int(np.count_nonzero(diff))
        if np.dtype(want.dtype).itemsize == 1 and bad <= REQUANTIZED_TIES * diff.size and diff.max(initial=0) <= 1:
            return None
        return f"{bad} elements differ (by up to {int(diff.max())})" if bad else None
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1.0)
    if not np.all(np.isfinite(g) == np.isfinite(w)):
        return "non-finite values where the reference has none"
    err = np.abs(g - w)
    limit = atol * scale + rtol * np.abs(w)
    finite = np.isfinite(w)
    if np.any(err[finite] > limit[finite]):
        worst = float(np.max(err[finite]))
        return f"max abs error {worst:.3g} (rtol {rtol}, atol {atol} x {scale:.3g})"
    return None


class CandidateRunner:
    """Loads artifacts, checks them against a reference, and times them on one device.

    One instance per device, run as a Ray actor pinned to the device's node; not thread-safe
    (a device times one candidate at a time). References are computed lazily from the
    task's unscheduled build, so a restarted actor rebuilds its state on demand.
    """

    def __init__(self, device_kind: str = "cpu", device_index: int = 0) -> None:
        if device_kind == "cuda" and not load_cuda_runtime():
            raise CudaToolchainError("TVM's CUDA runtime library does not load here (driver and libcudart.so.13?)")
        self.dev = tvm.cpu(0) if device_kind == "cpu" else tvm.cuda(device_index)
        self._inputs: dict[str, list[np.ndarray]] = {}
        self._reference: dict[str, list[np.ndarray]] = {}

    def info(self) -> dict[str, Any]:
        """Where the actor runs: Ray node id, pid, whether TVM's compiler library is loaded."""
        from tvm import base

        maps = Path("/proc/self/maps")
        compiler = "libtvm_compiler" in maps.read_text() if maps.exists() else None
        return {"node_id": self._node_id(), "pid": os.getpid(),
                "runtime_only": bool(base._RUNTIME_ONLY), "compiler_loaded": compiler, "device": str(self.dev)}

    def has_reference(self, task_key: str) -> bool:
        """Whether this actor holds the task's reference output."""
        return task_key in self._reference

    def set_reference(self, task_key: str, artifact: bytes, entry: str, args: list[ArgSpec]) -> RunResult:
        """Run the unscheduled (reference) build once and keep its outputs for the task."""
        inputs = random_args(args)
        try:
            outs = self._run(_load(artifact)[entry], inputs)
        except Exception as err:  # the reference itself failing is reported, not raised
            self._exit_if_context_fatal(err)
            return RunResult(error_class=ErrorClass.RUN_ERROR, error_msg=f"reference: {err}")
        self._inputs[task_key] = inputs
        self._reference[task_key] = outs
        return RunResult(run_secs=[0.0])

    def measure(
        self,
        task_key: str,
        artifact: bytes,
        entry: str,
        timing: TimingConfig,
        reference: Reference | None = None,
        best_sec: float | None = None,
    ) -> RunResult:
        """Check the candidate's outputs against the task's reference, then time it."""
        start = time.perf_counter()
        node = self._node_id()
        if task_key not in self._reference:
            if reference is None:
                return RunResult(error_class=ErrorClass.RUN_ERROR, error_msg="no reference output for the task",
                                 node_id=node)
            import ray

            ref = self.set_reference(task_key, ray.get(reference.artifact[0]), reference.entry, reference.args)
            if not ref.ok:
                return RunResult(error_class=ref.error_class, error_msg=ref.error_msg, node_id=node,
                                 busy_s=time.perf_counter() - start)
        try:
            lib = _load(artifact)
            check_start = time.perf_counter()
            outs = self._run(lib[entry], self._inputs[task_key])
            check_s = time.perf_counter() - check_start
        except Exception as err:  # runtime faults of a candidate are data
            self._exit_if_context_fatal(err)
            return RunResult(error_class=ErrorClass.RUN_ERROR, error_msg=f"{type(err).__name__}: {err}"[:2000],
                             node_id=node, busy_s=time.perf_counter() - start)
        for k, (got, want) in enumerate(zip(outs, self._reference[task_key], strict=True)):
            diff = compare(got, want)
            if diff is not None:
                return RunResult(error_class=ErrorClass.WRONG_RESULT, error_msg=f"argument {k}: {diff}",
                                 node_id=node, busy_s=time.perf_counter() - start)
        arrays = [tvm.runtime.tensor(a, self.dev) for a in self._inputs[task_key]]
        try:
            result = self._time(lib, entry, arrays, timing, best_sec, check_s)
        except Exception as err:
            self._exit_if_context_fatal(err)
            result = RunResult(error_class=ErrorClass.RUN_ERROR, error_msg=f"{type(err).__name__}: {err}"[:2000])
        return RunResult(
            run_secs=result.run_secs, error_class=result.error_class, error_msg=result.error_msg,
            early_stopped=result.early_stopped, remeasured=result.remeasured,
            busy_s=time.perf_counter() - start, node_id=node,
        )  # fmt: skip

    def _time(self, lib, entry: str, arrays: list, timing: TimingConfig, best_sec: float | None,
              check_s: float = 0.0) -> RunResult:
        start = time.perf_counter()
        budget = timing.max_timing_s if timing.max_timing_s > 0 else float("inf")
        repeat = timing.repeat
        if check_s * repeat > budget:  # the checked call (copies included) bounds one call's time
            repeat = max(1, int(budget // check_s))
            logger.debug("slow candidate (%.3g s a call): %d repeats instead of %d", check_s, repeat, timing.repeat)
        flush = timing.flush_cache and self.dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
        secs: list[float] = []
        if best_sec and timing.hopeless_factor > 0 and timing.probe > 0:
            probe = lib.time_evaluator(entry, self.dev, number=1, repeat=timing.probe)
            secs = [float(s) for s in probe(*arrays).results]
            if min(secs) > timing.hopeless_factor * best_sec:
                return RunResult(run_secs=secs, early_stopped=True)
            if flush or min(secs) * 1e3 < timing.min_repeat_ms:
                secs = []  # not a repeat: a repeat flushes the caches first, or lasts min_repeat_ms
            secs = secs[:repeat]

        def evaluator(n: int):
            return timing.evaluator(lib, entry, self.dev, n, flush=flush)

        if len(secs) < repeat:
            n = repeat - len(secs)
            round_start = time.perf_counter()
            secs += [float(s) for s in evaluator(n)(*arrays).results]
            round_s = (time.perf_counter() - round_start) * repeat / n  # one full round, without the probe
        else:
            round_s = sum(secs)
        rounds = 0
        contender = not best_sec or timing.contender_factor <= 0 or min(secs) <= timing.contender_factor * best_sec
        again = evaluator(repeat)
        while (contender and relative_spread(secs) > timing.max_spread and rounds < timing.max_remeasure
               and time.perf_counter() - start + round_s <= budget):
            secs += [float(s) for s in again(*arrays).results]
            rounds += 1
        logger.debug("median %.3g s over %d repeats, %d re-measurements", statistics.median(secs), len(secs), rounds)
        return RunResult(run_secs=secs, remeasured=rounds)

    def _exit_if_context_fatal(self, err: BaseException) -> None:
        """End the process after a CUDA error that leaves the context unusable.

        Every later call in this process would fail with the same error, so returning a
        result would blame the candidates after this one. Dying instead lets the measurer see
        the actor fail on this candidate, record it once as ``RUN_CRASH`` and time the rest on
        the restarted actor (``RayMeasurer._on_actor_failure``).
        """
        if self.dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type():
            return
        fatal = context_fatal(str(err))
        if fatal is None:
            return
        logger.error("%s: the CUDA context is unusable; the device actor restarts: %s", fatal, str(err)[:500])
        logging.shutdown()
        os._exit(70)  # not sys.exit: Ray would treat that as the actor's intended end

    def _run(self, func, inputs: list[np.ndarray]) -> list[np.ndarray]:
        arrays = [tvm.runtime.tensor(a, self.dev) for a in inputs]
        func(*arrays)
        self.dev.sync()
        return [a.numpy() for a in arrays]

    @staticmethod
    def _node_id() -> str | None:
        """This process's Ray node, or None outside Ray (asking Ray's runtime context there would
        start a local cluster)."""
        try:
            import ray

            return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        except Exception:  # no Ray at all
            return None


def _load(artifact: bytes) -> tvm.runtime.Module:
    """The candidate's library, loaded for as long as the returned module is referenced.

    ``tvm.runtime.load_module`` keeps every module it loads alive until the process ends
    (tvm_ffi's ``keep_module_alive``): a device actor that times one candidate after another
    then holds every library it ever loaded, five memory maps each, and past the kernel's
    ``vm.max_map_count`` (65,530) every load fails ("failed to map segment from shared
    object"), after about 13,000 candidates. Nothing a candidate's library allocates
    outlives the measurement (outputs are copied out to numpy), so it can go with it.
    """
    with tempfile.NamedTemporaryFile(suffix=".so", prefix="nightshift-run-") as f:
        Path(f.name).write_bytes(artifact)
        # The loaded library stays mapped after the file is unlinked.
        return tvm_ffi.load_module(f.name, keep_module_alive=False)
