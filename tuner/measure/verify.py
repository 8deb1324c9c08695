"""Checking that points build and compute what the unscheduled operator computes.

Used by the correctness tests and the sweep benchmark; the tuning job's own checks live in
``tuner.measure``, whose tolerance and random inputs this module shares.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

from search_spaces.base import Point, SearchSpace
from tuner.measure.runner import ArgSpec, random_args, tolerance

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reference:
    """Random inputs of a task and the unscheduled build's outputs on them (every argument
    after the call, so in-place outputs are compared too)."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


@dataclass(frozen=True)
class PointCheck:
    """What happened to one point: ``error`` is None, ``"build"``, ``"run"`` or ``"wrong"``;
    ``elementwise_ok`` says whether it also passed tuner.measure's elementwise tolerance."""

    point: Point
    build_sec: float
    error: str | None = None
    detail: str = ""
    elementwise_ok: bool = True


def arg_specs(mod: tvm.IRModule) -> list[ArgSpec]:
    """Shapes and dtypes of a task's arguments."""
    return [ArgSpec(tuple(int(d) for d in a.shape), str(a.dtype))
            for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])]


def reference(mod: tvm.IRModule, target: tvm.target.Target, *, seed: int = 0) -> Reference:
    """Build the unscheduled task and run it once on random inputs."""
    inputs = random_args(arg_specs(mod), seed=seed)
    lib = tvm.compile(mod, target=target)
    return Reference(inputs, _run(lib, inputs))


def check_point(space: SearchSpace, point: Point, ref: Reference) -> PointCheck:
    """Apply, build (timed) and run a point on the host CPU; compare with the reference."""
    start = time.perf_counter()
    try:
        lib = tvm.compile(space.apply(point).mod, target=space.target)
    except Exception as err:  # a failed build is the datum this check reports
        return PointCheck(point, time.perf_counter() - start, "build", f"{type(err).__name__}: {err}"[:500])
    build_sec = time.perf_counter() - start
    try:
        got = _run(lib, ref.inputs)
    except Exception as err:  # a crash of the candidate is reported, not raised
        return PointCheck(point, build_sec, "run", f"{type(err).__name__}: {err}"[:500])
    verdict = compare(got, ref.outputs)
    if verdict.wrong:
        return PointCheck(point, build_sec, "wrong", verdict.detail, elementwise_ok=False)
    return PointCheck(point, build_sec, elementwise_ok=verdict.elementwise_ok, detail=verdict.detail)


@dataclass(frozen=True)
class Verdict:
    """How a candidate's outputs compare with the reference's.

    ``elementwise_ok``: every element within tuner.measure's (rtol, atol). ``wrong``: some
    element is off by more than ``SCALED_RTOL`` times the largest reference value of its
    tensor. The second test exists because a reduction summed in another order differs in
    its last bits, and an epilogue that divides by a random near-zero parameter (a folded
    batch norm on random inputs) amplifies that to beyond any fixed atol; a wrong schedule
    (a missed term, a wrong index) is off by the order of the values themselves.
    """

    elementwise_ok: bool
    wrong: bool
    detail: str = ""


# Relative to a tensor's largest magnitude; fp32 reductions of ~10^4 terms stay below 1e-5.
SCALED_RTOL = 1e-4


def compare(got: list[np.ndarray], want: list[np.ndarray]) -> Verdict:
    """Compare outputs elementwise (the tuner's tolerance) and scaled (see :class:`Verdict`)."""
    elementwise_ok, wrong, detail = True, False, ""
    for g, w in zip(got, want, strict=True):
        rtol, atol = tolerance(str(w.dtype))
        if np.allclose(g, w, rtol=rtol, atol=atol):
            continue
        elementwise_ok = False
        err = float(np.max(np.abs(g.astype(np.float64) - w)))
        scale = float(np.max(np.abs(w.astype(np.float64)))) if w.size else 0.0
        finite = bool(np.all(np.isfinite(g) == np.isfinite(w)))
        if not finite or err > max(atol, SCALED_RTOL * scale):
            wrong = True
        detail = f"max abs error {err:.3g}, largest reference value {scale:.3g}"
    return Verdict(elementwise_ok, wrong, detail)


def _run(lib: tvm.runtime.Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    dev = tvm.cpu(0)
    arrays = [tvm.runtime.tensor(a, dev) for a in inputs]
    lib["main"](*arrays)
    return [a.numpy() for a in arrays]


@dataclass(frozen=True)
class TaskSweep:
    """The checks of a few random points of one space kind on one task."""

    model: str
    task: str
    kind: str
    checks: list[PointCheck]
    reference_error: str | None = None


def sweep_tasks(model: str, tasks: list, target: tvm.target.Target, *, points: int, seed: int = 0,
                kinds: tuple[str, ...] | None = None) -> list[TaskSweep]:
    """Sample ``points`` points of every applicable space kind of every task, build them and
    compare them with the unscheduled reference.

    Args:
        model: a label for the results.
        tasks: ``tuner.graph.tasks.Task`` objects.
        target: where to build (a CPU target: the points are also run here).
        points: points per task and kind.
        seed: seeds the sampling.
        kinds: restrict to these kinds; default every kind that applies to the task.
    """
    import search_spaces

    out: list[TaskSweep] = []
    for task in tasks:
        names = search_spaces.applicable_kinds(task.mod, target)
        try:
            ref = reference(task.mod, target, seed=seed)
        except Exception as err:  # a broken reference is reported with the task, not raised
            out.append(TaskSweep(model, task.name, "reference", [], f"{type(err).__name__}: {err}"[:500]))
            continue
        for kind in names:
            if kinds is not None and kind not in kinds:
                continue
            space = search_spaces.create(task.mod, target, kind=kind)
            rng = np.random.default_rng(seed)
            drawn = [space.sample(rng) for _ in range(min(points, space.size()))]
            checks = [check_point(space, p, ref) for p in drawn]
            bad = [c for c in checks if c.error]
            logger.info("%s %s [%s]: %d points, %d failed", model, task.name, kind, len(checks), len(bad))
            out.append(TaskSweep(model, task.name, kind, checks))
    return out
