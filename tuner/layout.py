"""Data layout of each conv as a decision: the plan, the graph rewrite, and the chooser.

Task extraction (:func:`tuner.tasks.extract_tasks`) and compilation
(:func:`tuner.compile.compile_model`) both run :func:`prepare` with the same
:class:`LayoutPlan`, so the tuned tasks are exactly the functions the compiler looks up; a
conv's layout is part of its PrimFunc, hence of its workload key.

Layouts: ``NCHW`` (as imported), ``NHWC`` (weights ``OHWI``) and blocked ``NCHW{b}c``
(weights ``OIHW{i}i{o}o``, TOPI's ``conv2d_NCHWc``): channels split into chunks of ``b``
lanes so the innermost loop of the conv fills a vector register. Relax's ``ConvertLayout``
rewrites the graph and inserts ``layout_transform`` where a consumer keeps another layout;
the weights' transforms are constants and fold away at compile time.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import tvm
from tvm import relax, topi
from tvm.relax import pipeline as relax_pipeline

from tuner.fold import fold_constants

logger = logging.getLogger(__name__)

NCHW = "NCHW"
NHWC = "NHWC"
_BLOCKED = re.compile(r"NCHW(\d+)c")
_CONV2D = "relax.nn.conv2d"
_GELU = "relax.nn.gelu"


def blocked(block: int) -> str:
    """The blocked layout name with ``block`` channels per chunk (``NCHW16c``)."""
    return f"NCHW{block}c"


def block_of(layout: str) -> int | None:
    """The channel block of ``NCHW{b}c``; None for an unblocked layout."""
    m = _BLOCKED.fullmatch(layout)
    return int(m.group(1)) if m else None


def check_layout(layout: str) -> str:
    """``layout`` if it is one a plan can hold, else ValueError naming the choices."""
    if layout in (NCHW, NHWC) or (block_of(layout) or 0) > 0:
        return layout
    raise ValueError(f"unknown conv layout {layout!r}: use NCHW, NHWC or NCHW<block>c (e.g. NCHW16c)")


def vector_lanes(target: tvm.target.Target) -> int:
    """fp32 lanes of the target's vector registers (16 with AVX-512, 8 with AVX2)."""
    from search_spaces.constraints import limits_for

    return limits_for(target).vector_bits // 32


@dataclass(frozen=True)
class LayoutPlan:
    """The data layout of every 2-D conv of a model.

    Attributes:
        default: layout of every conv not in ``layouts``.
        layouts: per-conv layouts, indexed by the conv's position in the model's ``main``
            (binding order, counting every ``relax.nn.conv2d``); shorter than the number of
            convs means the rest take ``default``.

    A blocked layout is a request: a conv whose channels the block does not divide takes the
    largest divisor below it (ResNet's first conv reads 3 channels: ``NCHW3c`` in), and
    grouped convs (TOPI's ``conv2d_NCHWc`` has no groups) stay NCHW. A plan holds one
    block size: TVM 0.27's ``ConvertLayout`` cannot convert between two blocked layouts
    (``NCHW4c`` to ``NCHW8c`` fails with "Invalid layout axis"), while the same block always
    gives a consumer the block its producer wrote (same channel count, same divisor).
    """

    default: str = NCHW
    layouts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for layout in (self.default, *self.layouts):
            check_layout(layout)
        blocks = {block_of(x) for x in (self.default, *self.layouts)} - {None}
        if len(blocks) > 1:
            raise ValueError(f"a layout plan holds one block size, got {sorted(blocks)}")

    def layout_of(self, index: int) -> str:
        """The layout planned for conv number ``index``."""
        return self.layouts[index] if index < len(self.layouts) else self.default

    @property
    def is_identity(self) -> bool:
        """True when every conv stays NCHW (the graph is left as imported)."""
        return self.default == NCHW and all(x == NCHW for x in self.layouts)

    def __str__(self) -> str:
        if not self.layouts:
            return self.default
        return f"{self.default} with " + ",".join(self.layouts)

    @classmethod
    def for_target(cls, target: tvm.target.Target) -> LayoutPlan:
        """The default plan: blocked by the vector width on x86 CPUs with AVX2 or AVX-512,
        NCHW elsewhere (CUDA, other CPUs)."""
        if str(target.kind.name) != "llvm" or not _is_x86(target):
            return cls(NCHW)
        lanes = vector_lanes(target)
        return cls(blocked(lanes)) if lanes >= 8 else cls(NCHW)

    @classmethod
    def parse(cls, text: str, target: tvm.target.Target) -> LayoutPlan:
        """``auto`` (:meth:`for_target`), ``NCHW``, ``NHWC``, ``NCHWc`` (the target's vector
        width) or ``NCHW<b>c``, applied to every conv."""
        if text == "auto":
            return cls.for_target(target)
        if text == "NCHWc":
            return cls(blocked(vector_lanes(target)))
        return cls(check_layout(text))


def _is_x86(target: tvm.target.Target) -> bool:
    triple = str(target.attrs.get("mtriple", "")) if "mtriple" in target.attrs else ""
    if triple:
        return triple.startswith(("x86_64", "i686", "i386"))
    import platform

    # A host target carries no triple: it is this machine.
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


# ----------------------------------------------------------------------------- the rewrite


def conv_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """The ``relax.nn.conv2d`` calls of ``main`` in binding order: the plan's indices."""
    calls: list[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == _CONV2D:
            calls.append(expr)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return calls


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def conv_layouts(call: relax.Call, layout: str) -> list[str] | None:
    """``ConvertLayout``'s [data, kernel, output] layouts that put ``call`` in ``layout``, or
    None for a conv not imported as NCHW/OIHW (left to follow its input)."""
    attrs = call.attrs
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return None
    # Even an NCHW conv is stated: without a wish, ConvertLayout runs a conv in its input's
    # layout. Grouped (depthwise) convs stay NCHW: conv2d_NCHWc has no groups, and TOPI's
    # grouped NHWC conv is unchecked here.
    if layout == NCHW or int(attrs.groups) != 1:
        return [NCHW, "OIHW", NCHW]
    if layout == NHWC:
        return [NHWC, "OHWI", NHWC]
    block = block_of(layout)
    assert block is not None
    out_ch, in_ch = (int(d) for d in call.args[1].ty.shape.values[:2])
    ib, ob = _largest_divisor(in_ch, block), _largest_divisor(out_ch, block)
    return [blocked(ib), f"OIHW{ib}i{ob}o", blocked(ob)]


def _legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """TOPI's ``conv2d_NCHWc`` for a blocked conv (the generic legalization leaves it as is);
    TVM's own legalization otherwise."""
    attrs = call.attrs
    if block_of(str(attrs.data_layout)) is None:
        return relax.transform.legalize_ops.nn._nn_conv2d(bb, call)
    # An unset out_dtype (None or "") means the data's dtype.
    out_dtype = str(attrs.out_dtype) if attrs.out_dtype not in (None, "", "void") else str(call.args[0].ty.dtype)
    return bb.call_te(
        topi.nn.conv2d_NCHWc, call.args[0], call.args[1],
        [int(s) for s in attrs.strides], [int(p) for p in attrs.padding], [int(d) for d in attrs.dilation],
        str(attrs.data_layout), str(attrs.out_layout), out_dtype,
        primfunc_name_hint="conv2d_NCHWc",
    )  # fmt: skip


def _static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return tuple(int(d) for d in values)


def simplify_sums(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``sum(stack([a, b, ...]), axis=stacked)`` as ``a + b + ...`` and drop
    ``broadcast_to`` onto a tensor's own shape.

    ONNX's importer writes every ``Sum`` node (ResNet's residual adds) that way; the 5-D
    stacked tensor has no layout ``ConvertLayout`` can carry a blocked layout through (it
    fails with "Invalid SLayout"), and an add fuses into the conv before it.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def same_shape_broadcast(expr: relax.Expr, matches: dict) -> relax.Expr:
        src = expr.args[0]
        return src if _static_shape(src) is not None and _static_shape(src) == _static_shape(expr) else expr

    stack = is_op("relax.stack")(wildcard())
    summed = is_op("relax.sum")(stack)

    def sum_of_stack(expr: relax.Expr, matches: dict) -> relax.Expr:
        stacked = matches[stack]
        parts = stacked.args[0]
        axis = int(stacked.attrs.axis)
        if not isinstance(parts, relax.Tuple) or expr.attrs.keepdims or [int(a) for a in expr.attrs.axis] != [axis]:
            return expr
        out = parts.fields[0]
        for part in parts.fields[1:]:
            out = relax.op.add(out, part)
        return out

    funcs = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            func = rewrite_call(is_op("relax.broadcast_to")(wildcard(), wildcard()), same_shape_broadcast, func)
            func = rewrite_call(summed, sum_of_stack, func)
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


def prepare(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan) -> tvm.IRModule:
    """Put every conv of a bound module (weights as constants) in its planned layout.

    Converts the graph (``layout_transform`` where consumers keep another layout), legalizes
    blocked convs to ``topi.nn.conv2d_NCHWc`` and everything else as TVM does (but GELU on
    CPUs, see :func:`_legalize_gelu`), and folds the weights' transforms into constants. On
    a non-CPU target an identity plan returns ``mod`` unchanged.
    """
    cpu = str(target.kind.name) == "llvm"
    if plan.is_identity and not cpu:
        return mod
    wanted: dict[relax.Call, list[str]] = {}
    for index, call in enumerate(conv_calls(mod)):
        layouts = conv_layouts(call, plan.layout_of(index))
        if layouts is not None:
            wanted[call] = layouts
    converted = sum(layouts[0] != NCHW for layouts in wanted.values())
    if not converted and not cpu:
        return mod
    if converted:
        mod = simplify_sums(mod)

    # ConvertLayout asks for the layouts of the original call (before it rewrites its args).
    def layout_cb(call: relax.Call) -> dict[str, list[str]]:
        layouts = wanted.get(call)
        return {_CONV2D: layouts} if layouts is not None else {}

    try:
        dispatch = list(relax_pipeline.library_dispatch_passes(target))
    except (ValueError, AttributeError):
        dispatch = []
    convert = tvm.transform.Sequential([
        relax.transform.ConvertLayout({}, layout_cb),
        relax.transform.CanonicalizeBindings(),
    ])  # fmt: skip
    custom = {_CONV2D: _legalize_conv2d}
    if cpu:
        custom[_GELU] = _legalize_gelu
    legalize = tvm.transform.Sequential([
        *dispatch,
        relax.transform.LegalizeOps(customize_legalize_map=custom),
        relax.transform.FoldConstant(),
    ])  # fmt: skip
    with target, tvm.transform.PassContext(opt_level=3):
        # The weights' layout transforms are folded in numpy before legalizing (tuner.fold);
        # FoldConstant would build each of them with LLVM.
        out = legalize(fold_constants(convert(mod) if converted else mod))
    logger.info("layout plan %s: %d of %d convs converted", plan, converted, len(wanted))
    return out


def _legalize_gelu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """GELU with TOPI's ``fast_erf`` (a float32 rational approximation, ~1e-7 relative error).

    TVM's own legalization calls ``erf``, which LLVM lowers to a scalar ``erff`` call per
    element: in BERT's FFN matmul + GELU task that held the register-tiled template at 151
    GFLOPS against 259 without GELU (benchmarks/op_ceiling.py).
    """
    if str(call.args[0].ty.dtype) != "float32":
        return relax.transform.legalize_ops.nn._nn_gelu(bb, call)

    def te_gelu(x):
        half = tvm.tirx.const(0.5, "float32")
        return x * (half + topi.fast_erf(x * tvm.tirx.const(0.5**0.5, "float32")) * half)

    return bb.call_te(te_gelu, call.args[0], primfunc_name_hint="gelu")


# ----------------------------------------------------------------------------- the chooser


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
            called with ``a != b`` only. ``i = len(conv_seconds)`` is the model's output.
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
                ((cost + secs + (transform_cost(i, prev, layout) if prev != layout else 0.0), (*path, layout))
                 for prev, (cost, path) in best.items()),
                key=lambda c: c[0],
            )  # fmt: skip
        best = step
    end = len(conv_seconds)
    total, path = min(
        ((cost + (transform_cost(end, last, output_layout) if last != output_layout else 0.0), path)
         for last, (cost, path) in best.items()),
        key=lambda c: c[0],
    )  # fmt: skip
    return LayoutChoice(LayoutPlan(path[-1], path), total)


def activation_elements(mod: tvm.IRModule) -> list[int]:
    """For each conv of ``mod`` in plan order, the number of elements of its input: what a
    layout transform in front of it moves (for :func:`transform_seconds`)."""
    return [math.prod(int(d) for d in call.args[0].ty.shape.values) for call in conv_calls(mod)]


def task_layout(mod: tvm.IRModule) -> str:
    """The conv layout of a task's PrimFunc (``NCHW16c``, ``NHWC``, ``NCHW``), read from its
    conv block; empty when it has none."""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    names = (("conv2d_NCHWc", None), ("conv2d_nchw", NCHW), ("conv2d_nhwc", NHWC),
             ("group_conv2d_nchw", NCHW), ("group_conv2d_nhwc", NHWC))  # fmt: skip
    for name, layout in names:
        try:
            block = sch.get(sch.get_sblock(name))
        except (RuntimeError, ValueError):  # no such block
            continue
        # A blocked conv is named by its output block: what its consumer reads.
        return layout or blocked(int(block.iter_vars[4].dom.extent))  # n, oc_chunk, oh, ow, oc_block
    return ""


def conv_task_keys(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan) -> list[str]:
    """For each conv of a bound module, in plan order, the workload key of the fused task
    that computes it under ``plan`` (the key :func:`tuner.tasks.extract_tasks` gives it)."""
    from tuner.tasks import fuse, workload_key  # tuner.tasks imports this module

    fused = fuse(prepare(mod, target, plan), target)
    keys: list[str] = []

    def visit(expr: relax.Expr) -> None:
        if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir"):
            return
        func = fused[expr.args[0]]
        # MetaSchedule extracts each PrimFunc as the ``main`` of its own module.
        task = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        if task_layout(task):
            keys.append(workload_key(task))

    # FuseOps keeps the binding order, and no fused function holds two convs.
    relax.analysis.post_order_visit(fused["main"].body, visit)
    if len(keys) != len(conv_calls(mod)):
        raise ValueError(f"found {len(keys)} conv tasks for {len(conv_calls(mod))} convs")
    return keys


def choose_from_database(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    best_seconds: Callable[[str], float | None],
    layouts: Sequence[str],
    *,
    bandwidth: float = 10e9,
) -> LayoutChoice:
    """The per-conv plan that the measurements favour, among uniform candidate ``layouts``.

    Args:
        mod: the bound module (:meth:`tuner.frontends.ModelSpec.bound`).
        target: the target the tasks were extracted for.
        best_seconds: a workload key's best measured seconds on the device, or None when it
            has no record (e.g. ``lambda k: (r := db.best(k, dev_id)) and r[0].mean_sec``).
        layouts: the layouts the model's convs were tuned in (``NCHW``, ``NCHW16c``, ...).
        bandwidth: bytes/s for :func:`transform_seconds`.

    A conv measured in no layout costs nothing in each, so only the transforms decide it.
    The candidates' blocked layouts must share one block (see :class:`LayoutPlan`).
    """
    LayoutPlan(NCHW, tuple(layouts))  # rejects unknown layouts and mixed blocks up front
    per_layout = {layout: conv_task_keys(mod, target, LayoutPlan(layout)) for layout in layouts}
    calls = conv_calls(mod)
    conv_seconds: list[dict[str, float]] = []
    for i in range(len(calls)):
        measured = {layout: best_seconds(keys[i]) for layout, keys in per_layout.items()}
        known = {k: float(v) for k, v in measured.items() if v is not None}
        conv_seconds.append(known or dict.fromkeys(layouts, 0.0))
    elements = [*activation_elements(mod), math.prod(int(d) for d in calls[-1].ty.shape.values)] if calls else []

    def cost(i: int, _src: str, _dst: str) -> float:
        return transform_seconds(elements[i], bandwidth=bandwidth)

    return choose_layouts(conv_seconds, cost)
