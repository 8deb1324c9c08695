"""Choosing each conv's layout from measured costs: a dynamic program over the convs' layouts
and the transforms between them.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import tvm
from tvm import relax

from tuner.graph.layout.plan import (
    NCHW,
    LayoutPlan,
    activation_elements,
    conv_calls,
    data_layout,
    io_bytes,
    task_layout,
    useful_layouts,
)
from tuner.graph.layout.rewrites import prepare

logger = logging.getLogger(__name__)


def transform_seconds(num_elements: int, *, bytes_per_element: int = 4, bandwidth: float = 10e9) -> float:
    """Estimated time of one ``layout_transform`` of a tensor: read it once and write it once
    at ``bandwidth`` bytes/s (a strided copy; 10 GB/s is a conservative single-core rate)."""
    return 2.0 * num_elements * bytes_per_element / bandwidth


@dataclass(frozen=True)
class LayoutChoice:
    """The chooser's answer: the plan and its estimated total seconds."""

    plan: LayoutPlan
    seconds: float


def choose_layouts(
    conv_seconds: Sequence[Mapping[str, float]],
    transform_cost: Callable[[int, str, str], float],
    *,
    input_layout: str = NCHW,
    output_layout: str = NCHW,
) -> LayoutChoice:
    """Each conv's layout by dynamic programming (Viterbi) over the chain of convs.

    Args:
        conv_seconds: for each conv in graph order, the best measured seconds of its task in
            each layout it was tuned in (a layout missing from a conv's map is not a choice
            for it; at least one per conv).
        transform_cost: ``transform_cost(i, a, b)``: seconds to bring conv ``i``'s input from
            layout ``a`` (what conv ``i - 1`` wrote, or ``input_layout`` for ``i = 0``) to ``b``;
            called only where ``a`` and ``b`` lay the data out differently.
            ``i = len(conv_seconds)`` is the model's output.
        input_layout: layout of the model's input.
        output_layout: layout the last conv's output must reach (NCHW: what the frontend's
            classifier head reads).

    Returns:
        The plan minimizing the sum of conv seconds and transform seconds, and that sum.

    What this approximates (as AutoTVM's graph tuner did for chains): the network is taken as
    the chain of its convs in graph order. Elementwise ops, pooling and residual adds run in
    whatever layout their producer wrote and are costed as free; a residual branch's own
    transform (an add whose two inputs arrive in different layouts) is not counted. For
    ResNet-like graphs, where consecutive convs share channel counts, this captures the
    transforms that matter.
    """
    if not conv_seconds:
        return LayoutChoice(LayoutPlan(NCHW), 0.0)
    # best[layout] = (cost so far, plan so far) after the current conv, ending in ``layout``.
    best: dict[str, tuple[float, tuple[str, ...]]] = {input_layout: (0.0, ())}
    for i, options in enumerate(conv_seconds):
        if not options:
            raise ValueError(f"conv {i} has no measured layout")
        step: dict[str, tuple[float, tuple[str, ...]]] = {}
        for layout, secs in options.items():
            step[layout] = min(
                ((cost + secs + (transform_cost(i, prev, layout) if _moves(prev, layout) else 0.0), (*path, layout))
                 for prev, (cost, path) in best.items()),
                key=lambda c: c[0],
            )  # fmt: skip
        best = step
    end = len(conv_seconds)
    total, path = min(
        ((cost + (transform_cost(end, last, output_layout) if _moves(last, output_layout) else 0.0), path)
         for last, (cost, path) in best.items()),
        key=lambda c: c[0],
    )  # fmt: skip
    return LayoutChoice(LayoutPlan(path[-1], path), total)


def _moves(src: str, dst: str) -> bool:
    """Whether going from a conv in ``src`` to one in ``dst`` transforms the tensor between
    them (not from ``NCHW16c`` to ``NCHW16c:w4``: the same data, another algorithm)."""
    return data_layout(src) != data_layout(dst)


@dataclass(frozen=True)
class PlanWorkloads:
    """The fused tasks a plan gives a model: ``tasks`` maps workload keys to (name, weight,
    task module); ``conv_keys`` is each conv's task key in plan order."""

    plan: LayoutPlan
    tasks: dict[str, tuple[str, int, tvm.IRModule]]
    conv_keys: list[str]


def plan_workloads(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan, *,
                   precision: str = "fp32") -> PlanWorkloads:  # fmt: skip
    """The tasks of a bound module (already in ``precision``) under ``plan``, with the keys
    :func:`tuner.graph.tasks.extract_tasks` gives them (without MetaSchedule's extraction)."""
    from tuner.graph.keys import workload_key  # tuner.graph.tasks imports this module
    from tuner.graph.tasks import fuse, fused_conv_keys

    fused = fuse(prepare(mod, target, plan), target)
    tasks: dict[str, tuple[str, int, tvm.IRModule]] = {}

    def visit(expr: relax.Expr) -> None:
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir"):
            return
        gv = expr.args[0]
        func = fused[gv]
        if func.attrs and func.attrs.get("tirx.is_scheduled", False):
            return
        task = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        key = workload_key(task, precision)
        name, weight, _ = tasks.get(key, (gv.name_hint, 0, task))
        tasks[key] = (name, weight + 1, task)

    relax.analysis.post_order_visit(fused["main"].body, visit)
    keys = fused_conv_keys(fused, precision)
    if len(keys) != len(conv_calls(mod)):
        raise ValueError(f"found {len(keys)} conv tasks for {len(conv_calls(mod))} convs")
    return PlanWorkloads(plan, tasks, keys)


def conv_task_keys(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan) -> list[str]:
    """For each conv of a bound module, in plan order, the workload key of the fused task
    that computes it under ``plan`` (the key :func:`tuner.graph.tasks.extract_tasks` gives it)."""
    return plan_workloads(mod, target, plan).conv_keys


def measured_bandwidth(plans: Sequence[PlanWorkloads], best_seconds: Callable[[str], float | None]) -> float | None:
    """Bytes/s of the model's measured ``layout_transform`` tasks (the median over them), or
    None when no plan has one measured: what a transform the plans do not contain costs."""
    rates = []
    seen: set[str] = set()
    for pw in plans:
        for key, (name, _weight, task) in pw.tasks.items():
            if key in seen or "layout_transform" not in name:
                continue
            seen.add(key)
            sec = best_seconds(key)
            moved = io_bytes(task)
            if sec and moved:
                rates.append(moved / sec)
    return sorted(rates)[len(rates) // 2] if rates else None


def plan_seconds(pw: PlanWorkloads, best_seconds: Callable[[str], float | None], bandwidth: float,
                 blind: Collection[str] = ()) -> float:  # fmt: skip
    """A plan's estimated model latency: every task's weight x best measured seconds; a task
    without a record costs its bytes at ``bandwidth`` (the transforms and elementwise ops a
    mixed plan adds), except a conv, which makes the plan unmeasured (inf), unless it is in
    ``blind`` (convs measured in no candidate layout: they cost nothing in every plan)."""
    convs = set(pw.conv_keys) - set(blind)
    total = 0.0
    for key, (_name, weight, task) in pw.tasks.items():
        sec = best_seconds(key)
        if sec is None:
            if key in convs:
                return math.inf
            if key in blind:
                continue
            sec = io_bytes(task) / bandwidth
        total += weight * sec
    return total


@dataclass(frozen=True)
class ConvDecision:
    """One conv's layout in the chosen plan and the best measured seconds of its task in each
    candidate layout (a layout without a record is absent)."""

    index: int
    layout: str
    seconds: dict[str, float]
    #: ``3x3 64->64 56x56``: kernel, channels and input size.
    shape: str = ""


@dataclass(frozen=True)
class PlanChoice:
    """What :func:`choose_from_database` chose, and why.

    Attributes:
        plan: the chosen plan.
        seconds: its estimated model latency (:func:`plan_seconds`).
        candidates: every plan weighed (each uniform layout, the chain optimum) by its
            description, with its estimated latency (inf: a conv of it was never measured).
        convs: each conv's decision with its measured seconds per layout.
        bandwidth: bytes/s charged for a transform; ``bandwidth_measured`` says whether it
            came from the model's measured transform tasks or :data:`DEFAULT_BANDWIDTH`.
    """

    plan: LayoutPlan
    seconds: float
    candidates: dict[str, float]
    convs: list[ConvDecision]
    bandwidth: float
    bandwidth_measured: bool

    @property
    def measured(self) -> bool:
        """Whether the choice rests on measurements (else it is the target's default plan)."""
        return math.isfinite(self.seconds)

    def _gap(self, name: str) -> str:
        """Why a candidate plan has no estimate: how many of its convs lack a measurement."""
        missing = sum(1 for c in self.convs if not math.isfinite(c.seconds.get(name, math.inf)))
        if name not in {lay for c in self.convs for lay in c.seconds} or not missing:
            return "not estimated (a conv of it has no record)"
        return f"not estimated ({missing} of {len(self.convs)} convs unmeasured in it)"

    def describe(self) -> str:
        """One line: the chosen plan against the other candidates."""
        counts: dict[str, int] = {}
        for c in self.convs:
            counts[c.layout] = counts.get(c.layout, 0) + 1
        mix = ", ".join(f"{n} {layout}" for layout, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        others = "; ".join(f"{name} {sec * 1e3:.2f} ms" if math.isfinite(sec) else f"{name} {self._gap(name)}"
                           for name, sec in self.candidates.items())  # fmt: skip
        if not self.measured:
            return f"convs: {mix} (no measured plan; the target's default); weighed: {others}"
        return f"convs: {mix}, estimated {self.seconds * 1e3:.2f} ms; weighed: {others}"

    def to_json(self) -> dict:
        """The choice as plain JSON types (inf as None)."""

        def ms(sec: float) -> float | None:
            return sec * 1e3 if math.isfinite(sec) else None

        return {
            "plan": str(self.plan), "layouts": [c.layout for c in self.convs], "estimated_ms": ms(self.seconds),
            "candidates_ms": {name: ms(sec) for name, sec in self.candidates.items()},
            "bandwidth_gbps": self.bandwidth / 1e9, "bandwidth_measured": self.bandwidth_measured,
            "convs": [{"index": c.index, "shape": c.shape, "layout": c.layout,
                       "best_ms": {k: v * 1e3 for k, v in c.seconds.items()}} for c in self.convs],
        }  # fmt: skip


# Bytes/s charged for a layout transform when the model has none measured: a strided copy on
# one core (conservative).
DEFAULT_BANDWIDTH = 10e9


def choose_from_database(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    best_seconds: Callable[[str], float | None],
    layouts: Sequence[str],
    *,
    precision: str = "fp32",
    bandwidth: float | None = None,
) -> PlanChoice:
    """The per-conv plan that the measurements favour, among uniform candidate ``layouts``.

    Args:
        mod: the bound module (:meth:`tuner.frontends.ModelSpec.bound`), in ``precision``.
        target: the target the tasks were extracted for.
        best_seconds: a workload key's best measured seconds on the device, or None when it
            has no record (e.g. ``lambda k: (r := db.best(k, dev_id)) and r[0].mean_sec``).
        layouts: the layouts the model's convs were tuned in (``NCHW8c``, ``NCHW``, ...),
            preferred first (it breaks ties).
        precision: the precision of the workload keys.
        bandwidth: bytes/s of a layout transform; default: measured from the model's
            ``layout_transform`` tasks in the database, else :data:`DEFAULT_BANDWIDTH`.

    Two steps. The chain optimum (:func:`choose_layouts`) over the convs' measured bests,
    each switch of layout costing a transform of the conv's input at ``bandwidth``. Then
    every candidate (that plan and each uniform plan) is costed in full from the tasks it
    really gives the model (:func:`plan_seconds`): every transform, residual ones included,
    and every operator in the layout it ends up in. The cheapest wins, so the choice is never
    estimated slower than the best single layout. A conv measured in no layout costs nothing
    in each, so only the transforms decide it; a plan that puts a conv in a layout it was not
    measured in is unmeasured (inf). When no plan is measured, the target's default plan.
    """
    LayoutPlan(NCHW, tuple(layouts))  # rejects unknown layouts and mixed blocks up front
    layouts = useful_layouts(mod, layouts)
    uniform = [plan_workloads(mod, target, LayoutPlan(layout), precision=precision) for layout in layouts]
    measured = measured_bandwidth(uniform, best_seconds)
    bw = bandwidth or measured or DEFAULT_BANDWIDTH
    calls = conv_calls(mod)
    conv_seconds: list[dict[str, float]] = []
    for i in range(len(calls)):
        found = {pw.plan.default: best_seconds(pw.conv_keys[i]) for pw in uniform}
        conv_seconds.append({k: float(v) for k, v in found.items() if v is not None})
    elements = [*activation_elements(mod), math.prod(int(d) for d in calls[-1].ty.shape.values)] if calls else []
    itemsize = tvm.DataType(str(calls[0].args[0].ty.dtype)).bits // 8 if calls else 4

    def cost(i: int, _src: str, _dst: str) -> float:
        return transform_seconds(elements[i], bytes_per_element=itemsize, bandwidth=bw)

    chain = choose_layouts([c or dict.fromkeys(layouts, 0.0) for c in conv_seconds], cost)
    blind = {pw.conv_keys[i] for i, c in enumerate(conv_seconds) if not c for pw in uniform}
    candidates = {pw.plan.default: (pw, plan_seconds(pw, best_seconds, bw, blind)) for pw in uniform}
    chain_plan = chain.plan
    if len(set(chain_plan.layouts)) == 1:
        chain_plan = LayoutPlan(chain_plan.layouts[0])
    if str(chain_plan) not in candidates:
        pw = plan_workloads(mod, target, chain_plan, precision=precision)
        candidates["per-conv chain"] = (pw, plan_seconds(pw, best_seconds, bw, blind))
    if not any(conv_seconds):
        # No conv measured in any layout: transforms alone would rank the plans, on nothing
        # the database knows. Every plan is unmeasured, and the target's default is taken.
        candidates = {name: (pw, math.inf) for name, (pw, _sec) in candidates.items()}
    # min keeps the first of equals: the preferred layout.
    best_pw, best_sec = min(candidates.values(), key=lambda c: c[1])
    if not math.isfinite(best_sec):
        best_pw = candidates.get(LayoutPlan.for_target(target).default, (uniform[0], math.inf))[0]
    plan = best_pw.plan
    convs = [ConvDecision(i, plan.layout_of(i), conv_seconds[i], _conv_shape(call)) for i, call in enumerate(calls)]
    choice = PlanChoice(plan, best_sec, {name: sec for name, (_pw, sec) in candidates.items()}, convs, bw,
                        bandwidth is None and measured is not None)  # fmt: skip
    logger.info("layout choice: %s", choice.describe())
    return choice


def _conv_shape(call: relax.Call) -> str:
    out_ch, in_ch, kh, kw = (int(d) for d in call.args[1].ty.shape.values[:4])
    h, w = (int(d) for d in call.args[0].ty.shape.values[2:4])
    groups = int(call.attrs.groups)
    grouped = f" /{groups}" if groups != 1 else ""
    return f"{kh}x{kw} {in_ch * groups}->{out_ch}{grouped} {h}x{w}"


_SUMMARY_LAYOUT = re.compile(r" layout=(\S+)$")


def stored_layouts(db, keys: Collection[str] | None = None) -> dict[str, str]:
    """The conv layout of each stored workload (of ``keys``, default all) that has a conv:
    the layout every record of that workload belongs to.

    Read from the workload's summary (``... layout=NCHW8c``, written since the layout became
    a tuning decision); a workload stored before that is read from its serialized PrimFunc.
    SQL reaches the same facts: ``SELECT key FROM workloads WHERE summary LIKE '% layout=NCHW'``.
    """
    import json

    from sqlalchemy import select
    from tvm.s_tir.meta_schedule.database import Workload

    from tuner.db.schema import WorkloadRow

    stmt = select(WorkloadRow.key, WorkloadRow.summary, WorkloadRow.workload_json)
    if keys is not None:
        stmt = stmt.where(WorkloadRow.key.in_(list(keys)))
    with db.session(write=False) as s:
        rows = list(s.execute(stmt))
    found: dict[str, str] = {}
    for key, summary, workload_json in rows:
        if summary and (m := _SUMMARY_LAYOUT.search(summary)):
            found[key] = m.group(1)
            continue
        try:
            layout = task_layout(Workload.from_json(json.loads(workload_json)).mod)
        except Exception as err:  # a workload of another TVM version may not load: no layout known
            logger.debug("workload %s: %s", key, err)
            continue
        if layout:
            found[key] = layout
    return found
