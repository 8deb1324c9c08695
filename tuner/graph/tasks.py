"""Tasks: the fused operators of a model, each with its weight, FLOPs and workload key."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import tvm
from tvm import relax
from tvm.relax import pipeline as relax_pipeline
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from tuner.graph.keys import workload_key
from tuner.graph.layout.plan import LayoutPlan, conv_calls, task_layout, useful_layouts
from tuner.graph.layout.rewrites import prepare
from tuner.graph.pad_fusion import fold_pad_into_producer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """One fused operator to tune.

    Attributes:
        name: TVM's readable name (``fused_conv2d_add_relu``); not unique across shapes.
        mod: an IRModule whose ``main`` is the fused PrimFunc, as TVM's compiler sees it.
        weight: how many times the operator occurs in the model.
        flops: floating-point operations of one call.
        workload_key: stable hex key of the PrimFunc's structure, the database's workload id.
        layout: the conv's data layout (``NCHW``, ``NHWC``, ``NCHW16c``); empty for an
            operator without a conv.
        choice: for a conv tuned in several layouts (:func:`extract_layout_tasks`), the id
            shared by its layout variants: the model runs exactly one of them, so they are
            alternatives, not addends, in its latency. Empty for a task without alternatives.
        choice_rank: the variant's layout's position among the candidate layouts (0: the
            first, the target's preferred layout).
        io_bytes: bytes of the conv's input and output tensors: what the layout transforms
            around it move when its neighbours run in another layout.
        plans: for :func:`extract_layout_tasks`, the candidate layouts (by position) whose
            uniform plan runs this task, when that is not all of them (a ``mean`` reading
            NCHW8c runs only where the convs before it are blocked); empty: every plan.
    """

    name: str
    mod: tvm.IRModule
    weight: int
    flops: float
    workload_key: str
    layout: str = ""
    choice: str = ""
    choice_rank: int = 0
    io_bytes: int = 0
    plans: tuple[int, ...] = ()


def operator_count(tasks: Sequence[Task]) -> int:
    """How many fused operators the model runs: the tasks of one layout plan (the first), where
    :func:`extract_layout_tasks` tuned each conv in several layouts and each layout's own other
    operators beside it."""
    return len({t.choice for t in tasks if t.choice}) + sum(
        1 for t in tasks if not t.choice and (not t.plans or 0 in t.plans))


def fuse_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """The graph passes that turn a Relax model into fused TIR functions.

    The sequence of ``meta_schedule.relax_integration.compile_relax`` plus
    :func:`tuner.graph.pad_fusion.fold_pad_into_producer`; :func:`tuner.compile.compile_model` runs
    the same, so the tasks tuned here are exactly the functions it looks up.
    """
    try:
        dispatch = list(relax_pipeline.library_dispatch_passes(target))
    except (ValueError, AttributeError):
        dispatch = []
    return [
        *dispatch,
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        fold_pad_into_producer,
        relax.transform.FuseTIR(),
    ]


def fuse(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` through :func:`fuse_passes`."""
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(fuse_passes(target))(mod)


def extract_tasks(
    mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan | None = None, *, precision: str = "fp32"
) -> list[Task]:
    """Fused-operator tasks of a bound Relax module, heaviest (weight x FLOPs) first.

    ``plan`` sets each conv's data layout (:func:`tuner.graph.layout.rewrites.prepare`; default
    :meth:`LayoutPlan.for_target`); ``precision`` the model's precision
    (:func:`tuner.precision.apply_precision`); compile with the same plan and precision.
    Identical workloads (same PrimFunc structure) are merged into one task whose weight is
    the number of occurrences.
    """
    from tuner.precision import apply_precision

    plan = LayoutPlan.for_target(target) if plan is None else plan
    fused = fuse(prepare(apply_precision(mod, precision, target), target, plan), target)
    return _fused_tasks(fused, target, precision)


def _fused_tasks(fused: tvm.IRModule, target: tvm.target.Target, precision: str) -> list[Task]:
    """The tasks of a fused module (see :func:`extract_tasks`), heaviest first."""
    extracted = ms.relax_integration.extract_tasks(fused, target)
    by_key: dict[str, Task] = {}
    for ext in extracted:
        task_mod = ext.dispatched[0]
        if task_mod["main"].attrs and task_mod["main"].attrs.get("tirx.is_scheduled", False):
            continue
        key = workload_key(task_mod, precision)
        if key in by_key:
            old = by_key[key]
            by_key[key] = replace(old, weight=old.weight + int(ext.weight))
            continue
        try:
            flops = float(estimate_tir_flops(task_mod))
        except (RuntimeError, ValueError):  # TVM 0.27 raises RuntimeError subclasses
            flops = 0.0
        by_key[key] = Task(str(ext.task_name), task_mod, int(ext.weight), flops, key, task_layout(task_mod))
    tasks = sorted(by_key.values(), key=lambda t: (-t.weight * t.flops, t.name))
    logger.info("%d tasks from %d extracted functions", len(tasks), len(extracted))
    return tasks


def fused_conv_keys(fused: tvm.IRModule, precision: str = "fp32") -> list[str]:
    """For each conv of a fused module, in plan order (binding order of ``main``), the
    workload key of the task that computes it."""
    keys: list[str] = []

    def visit(expr: relax.Expr) -> None:
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir"):
            return
        func = fused[expr.args[0]]
        # MetaSchedule extracts each PrimFunc as the ``main`` of its own module.
        task = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        if task_layout(task):
            keys.append(workload_key(task, precision))

    # FuseOps keeps the binding order, and no fused function holds two convs.
    relax.analysis.post_order_visit(fused["main"].body, visit)
    return keys


def extract_layout_tasks(
    mod: tvm.IRModule, target: tvm.target.Target, layouts: Sequence[str], *, precision: str = "fp32"
) -> list[Task]:
    """The tasks of a model whose convs are each to run in the best of ``layouts``.

    The model's tasks under each uniform plan (every conv in one layout), merged: a task
    identical across plans (dense, softmax, a conv that stays NCHW) is one task, with the
    weight it has in one plan. The variants of a conv in the different layouts share a
    :attr:`Task.choice` id, so the scheduler treats them as alternatives; after tuning,
    :func:`tuner.graph.layout.choose_plan` picks each conv's layout from their measurements.
    Heaviest first, as :func:`extract_tasks`.
    """
    from tuner.precision import apply_precision

    if not layouts:
        raise ValueError("no candidate layouts")
    base = apply_precision(mod, precision, target)
    layouts = useful_layouts(base, layouts)
    calls = conv_calls(base)
    itemsize = [tvm.DataType(str(c.args[0].ty.dtype)).bits // 8 for c in calls]
    io_bytes = [(math.prod(int(d) for d in c.args[0].ty.shape.values) + math.prod(int(d) for d in c.ty.shape.values))
                * size for c, size in zip(calls, itemsize, strict=True)]  # fmt: skip
    merged: dict[str, Task] = {}
    # Union-find over workload keys: the keys one conv gets in each layout are one decision.
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    conv_io: dict[str, int] = {}
    rank: dict[str, int] = {}
    in_plans: dict[str, set[int]] = {}
    for r, layout in enumerate(layouts):
        fused = fuse(prepare(base, target, LayoutPlan(layout)), target)
        for t in _fused_tasks(fused, target, precision):
            old = merged.get(t.workload_key)
            merged[t.workload_key] = t if old is None else replace(old, weight=max(old.weight, t.weight))
            rank.setdefault(t.workload_key, r)
            in_plans.setdefault(t.workload_key, set()).add(r)
        keys = fused_conv_keys(fused, precision)
        if len(keys) != len(calls):
            raise ValueError(f"found {len(keys)} conv tasks for {len(calls)} convs under {layout}")
        if r == 0:
            first = keys
        for i, key in enumerate(keys):
            conv_io[key] = io_bytes[i]
            parent[find(key)] = find(first[i])
    groups: dict[str, list[str]] = {}
    for key in conv_io:
        groups.setdefault(find(key), []).append(key)
    choice = {k: min(members) for members in groups.values() if len(members) > 1 for k in members}
    tasks = [replace(t, choice=choice.get(k, ""), choice_rank=rank[k], io_bytes=conv_io.get(k, 0),
                     plans=() if len(in_plans[k]) == len(layouts) else tuple(sorted(in_plans[k])))
             for k, t in merged.items()]  # fmt: skip
    # Two plans' modules each name their functions: a later plan's task that takes a name an
    # earlier plan's holds (a `mean` reading NCHW8c beside one reading NCHW, the F(2, 3)
    # Winograd conv beside the F(4, 3) one) says its layout, so tables, events and reports
    # keyed by name keep them apart.
    taken: set[str] = set()
    named = []
    for t in sorted(tasks, key=lambda t: t.choice_rank):
        if t.choice_rank and t.name in taken:
            t = replace(t, name=f"{t.name}[{layouts[t.choice_rank]}]")
        taken.add(t.name)
        named.append(t)
    tasks = named
    tasks.sort(key=lambda t: (-t.weight * t.flops, t.name))
    logger.info("%d tasks over layouts %s, %d convs with alternatives", len(tasks), ", ".join(layouts), len(choice))
    return tasks
