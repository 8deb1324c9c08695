"""Graph rewrites around the layout plan, and :func:`prepare`, which applies the plan to a model."""

from __future__ import annotations

import functools
import logging

import tvm
from tvm import relax
from tvm.relax import pipeline as relax_pipeline

from tuner.graph.fold import fold_constants
from tuner.graph.gates import gate_vars, legalize_gate_multiply
from tuner.graph.layout.channel_moves import gather_channel_moves
from tuner.graph.layout.channel_pad import pad_channels
from tuner.graph.layout.legalize import (
    FAST_MATH,
    PAD_APART,
    _legalize_conv2d,
    _legalize_layout_transform,
    _legalize_matmul,
    _legalize_softmax,
    _static_shape,
)
from tuner.graph.layout.plan import (
    _CONV2D,
    _LAYOUT_TRANSFORM,
    _MATMUL,
    _SOFTMAX,
    NCHW,
    LayoutPlan,
    block_of,
    conv_calls,
    conv_layouts,
    vector_lanes,
    wide_blocks,
    winograd_fits,
    winograd_tile,
)
from tuner.graph.pad_fusion import var_reads
from tuner.graph.separable_resize import legalize_resize2d

logger = logging.getLogger(__name__)


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


def dropout_as_identity(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``dropout(x)`` as the tuple ``(x, x)``: the identity it is at inference.

    ONNX's importer keeps a ``Dropout`` node as ``relax.nn.dropout``, whose result is a tuple
    (the output and a mask of the same type). ``ConvertLayout`` infers one leaf layout for that
    tuple and then fails ("Expected nested to match tuple"); as a tuple of the input it carries
    the input's layout through, and the bindings of its parts fold away.
    """
    return _rewrite_calls(mod, {"relax.nn.dropout": lambda _bb, call: relax.Tuple([call.args[0], call.args[0]])})


def concat_apart(mod: tvm.IRModule, block: int | None = None) -> tvm.IRModule:
    """Put every ``concat`` that ``ConvertLayout`` cannot carry ``NCHW{block}c`` through in a
    TIR function of its own before ``ConvertLayout``.

    ``ConvertLayout``'s layout inference for ``concat`` gives every input the first one's
    layout and concatenates along its outer channel axis: right in ``NCHW{block}c`` when each
    input's channels are whole blocks (SqueezeNet's fire modules, 64 + 64), so those stay
    ``concat`` and the next conv reads the result without a transform. Otherwise it fails
    (TVM 0.27: "Invalid layout axis 16b" where an input's channels are not a multiple of the
    block, or of 5 and 7 channels; "Expected nested to match tuple" through a tuple that is
    not a literal one): as a ``call_tir``, which has no layout inference, its inputs are
    transformed back to the layout the graph was imported in, and each transform fuses into
    the concatenation's function. ``block`` None puts every concat apart.
    """
    from tvm import topi

    def apart(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        arg, axis = call.args[0], int(call.attrs.axis)
        if isinstance(arg, relax.Tuple):
            if block is not None and _whole_blocks(arg, axis, block):
                return call
            parts = list(arg.fields)
        else:
            parts = [relax.TupleGetItem(arg, i) for i in range(len(relax.analysis.get_static_type(arg).fields))]
        # Named for its axis where it joins channels: tuner.graph.layout.channel_moves reads it.
        channels = axis in (1, -3) and all(len(_static_shape(p) or ()) == 4 for p in parts)
        return bb.call_te(lambda *xs: topi.concatenate(xs, axis), *parts,
                          primfunc_name_hint="concatenate_channels" if channels else "concatenate")  # fmt: skip

    return _rewrite_calls(mod, {"relax.concat": apart})


def _whole_blocks(parts: relax.Tuple, axis: int, block: int) -> bool:
    """Whether a concat of ``parts`` along ``axis`` joins 4-D tensors along their channels in
    whole ``block``-channel chunks: then every part is written in ``NCHW{block}c`` (a conv
    whose channels the block divides takes the block,
    :func:`~tuner.graph.layout.plan.channel_block`) or converts to it."""
    shapes = [_static_shape(p) for p in parts.fields]
    if any(s is None or len(s) != 4 for s in shapes) or axis not in (1, -3):
        return False
    return all(s[1] % block == 0 for s in shapes if s is not None)


#: Elementwise binary operators whose layout inference needs operands of one rank.
_BROADCAST_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum")


def constants_to_rank(mod: tvm.IRModule) -> tvm.IRModule:
    """Give a constant operand of an elementwise binary operator the rank of the tensor it
    broadcasts against: ``multiply(x, c)`` with ``x`` 4-D and ``c`` of shape ``(C, 1, 1)``
    reads ``c`` as ``(1, C, 1, 1)``, the same numbers by broadcasting.

    ONNX graphs scale by ``(C, 1, 1)`` constants (DenseNet-121's batch norms as Mul and Add);
    ``ConvertLayout``'s inference for a binary operator cannot carry a blocked layout to an
    operand of lower rank, so each such operator ran in NCHW between two transforms. Of equal
    rank, the constant's transform folds away like a weight's.
    """
    from tvm.ir.expr import Constant

    def widen(_bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        shapes = [_static_shape(a) for a in call.args]
        if any(s is None for s in shapes) or len(call.args) != 2:
            return call
        rank = max(len(s) for s in shapes if s is not None)
        if rank != 4:  # the layouts are of 4-D tensors; a dense head stays the task it is in NCHW
            return call
        args = []
        for arg, shape in zip(call.args, shapes, strict=True):
            if isinstance(arg, Constant) and shape is not None and 0 < len(shape) < rank:
                arg = relax.const(arg.value.numpy().reshape((1,) * (rank - len(shape)) + shape), str(arg.ty.dtype))
            args.append(arg)
        if all(a.same_as(b) for a, b in zip(args, call.args, strict=True)):
            return call
        return relax.Call(call.op, args, call.attrs)

    return _rewrite_calls(mod, dict.fromkeys(_BROADCAST_BINARY, widen))


def _rewrite_calls(mod: tvm.IRModule, rewrites: dict) -> tvm.IRModule:
    """``mod`` with each call of an operator in ``rewrites`` replaced by what its function
    (``(block_builder, call) -> expr``) returns; every other binding is kept as it is (no
    common-subexpression merging, so a model's convs stay one binding each)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    if not any(isinstance(f, relax.Function) and _calls_any(f, rewrites) for f in mod.functions.values()):
        return mod

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            rewrite = rewrites.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
            return call if rewrite is None else rewrite(self.builder_, call)

    mutator_ = _Rewrite(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator_.builder_.update_func(gv, mutator_.visit_expr(func))
    return mutator_.builder_.get()


def _calls_any(func: relax.Function, ops: dict) -> bool:
    found = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in ops:
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return bool(found)


def clip_as_min_max(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``clip(x, lo, hi)`` (ReLU6) as ``minimum(maximum(x, lo), hi)``.

    Relax registers no layout inference for ``clip``, so ``ConvertLayout`` brings its input
    back to NCHW and its output forward again: in MobileNet-V2 that put two transforms
    around every ReLU6 (a third of the model's time) and kept ReLU6 out of the convs'
    epilogues. Elementwise ``maximum``/``minimum`` follow any layout, and their scalar
    constants legalize to immediates.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def as_min_max(expr: relax.Call, matches: dict) -> relax.Expr:
        x, lo, hi = expr.args
        dtype = str(x.ty.dtype)
        # The bounds are immediates (a PrimValue around one in older Relax).
        imm = (tvm.tirx.IntImm, tvm.tirx.FloatImm)
        bounds = [b if isinstance(b, imm) else getattr(b, "value", None) for b in (lo, hi)]
        if any(not isinstance(v, imm) for v in bounds) or not dtype.startswith("float"):
            return expr
        low, high = (relax.const(float(v.value), dtype) for v in bounds)
        return relax.op.minimum(relax.op.maximum(x, low), high)

    funcs = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            func = rewrite_call(is_op("relax.clip")(wildcard(), wildcard(), wildcard()), as_min_max, func)
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


def sole_readers(func: relax.Function) -> frozenset[relax.Var]:
    """The variables bound in ``func`` that one expression alone reads: a conv's data among
    them is nothing else's, so its producer may write it in the conv's own layout
    (parameters are left out: no function of the graph produces them)."""
    reads = var_reads(func)
    return frozenset(b.var for block in func.body.blocks for b in block.bindings if reads.get(b.var) == 1)


#: The fallbacks :func:`prepare` has warned of: (failure, model fingerprint), so that a model
#: whose graph no plan can convert logs one line, not one a plan (``--layout auto`` prepares
#: several, and compiling prepares the chosen one again).
_WARNED: set[tuple[str, tuple[str, ...]]] = set()


def prepare(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan) -> tvm.IRModule:
    """Put every conv of a bound module (weights as constants) in its planned layout.

    Converts the graph (``layout_transform`` where consumers keep another layout), legalizes
    blocked convs to ``topi.nn.conv2d_NCHWc`` and everything else as TVM does (but GELU,
    softmax and dense layers with packed weights on CPUs, see :func:`_legalize_gelu` and
    :func:`_legalize_matmul`), and folds the weights' transforms into constants. On
    a non-CPU target an identity plan returns ``mod`` unchanged.

    Where TVM fails to apply a plan other than NCHW (``ConvertLayout`` meets an operator
    pattern it cannot carry a layout through), the model is prepared in NCHW instead, with
    one warning: a slower model beats a lost run. Task extraction and compilation both come
    here, so they fall back alike and the tuned tasks stay the compiled ones. A failure in
    NCHW itself is raised.
    """
    if plan.is_identity:
        return _prepare(mod, target, plan)
    try:
        return _prepare(mod, target, plan)
    except Exception as err:  # TVM's C++ checks surface as RuntimeError, ValueError, TypeError...
        nchw = LayoutPlan(NCHW)
        reason = _last_line(err)
        key = (reason, tuple(str(call.args[1].ty.shape) for call in conv_calls(mod)))
        if key not in _WARNED:
            _WARNED.add(key)
            logger.warning("layout %s does not apply to this graph (%s); its convs run in NCHW", plan, reason)
        logger.debug("layout %s failed", plan, exc_info=True)
        return _prepare(mod, target, nchw)


def _last_line(err: BaseException) -> str:
    """``Type: last line`` of an exception (TVM's messages end with the check that failed)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    name = type(err).__name__
    text = (lines[-1] if lines[-1].startswith(f"{name}:") else f"{name}: {lines[-1]}") if lines else name
    return text if len(text) <= 200 else text[:197] + "..."


def _wishes(mod: tvm.IRModule, plan: LayoutPlan) -> tuple[dict[relax.Call, list[str]], dict[int, int]]:
    """``ConvertLayout``'s layouts for each conv of ``mod`` the plan converts, and the Winograd
    tile of each conv (by index) that runs by Winograd."""
    wanted: dict[relax.Call, list[str]] = {}
    tiles: dict[int, int] = {}
    for index, call in enumerate(conv_calls(mod)):
        layouts = conv_layouts(call, plan.layout_of(index))
        if layouts is not None:
            wanted[call] = layouts
            tile = winograd_tile(plan.layout_of(index))
            if tile is not None and block_of(layouts[0]) is not None and winograd_fits(call):
                tiles[index] = tile
    return wanted, tiles


def _prepare(mod: tvm.IRModule, target: tvm.target.Target, plan: LayoutPlan) -> tvm.IRModule:
    """:func:`prepare` without its fallback."""
    cpu = str(target.kind.name) == "llvm"
    if plan.is_identity and not cpu:
        return mod
    wanted, tiles = _wishes(mod, plan)
    converted = sum(layouts[0] != NCHW for layouts in wanted.values())
    if not converted and not cpu:
        return mod
    if converted:
        # A plan holds one block size (a conv whose channels it does not divide takes a
        # divisor, or is padded to whole blocks where the divisor is under half a block).
        block = next((b for b in map(block_of, (plan.default, *plan.layouts)) if b is not None), None)
        mod = constants_to_rank(dropout_as_identity(clip_as_min_max(simplify_sums(mod))))
        mod, padded = pad_channels(mod, [plan.layout_of(i) for i in range(len(conv_calls(mod)))])
        if padded:
            wanted, tiles = _wishes(mod, plan)
        mod = concat_apart(mod, block)

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
    with target, tvm.transform.PassContext(opt_level=3):
        # The weights' layout transforms are folded in numpy before legalizing (tuner.graph.fold);
        # FoldConstant would build each of them with LLVM.
        folded = fold_constants(convert(mod) if converted else mod)
    if converted:
        folded, _ = gather_channel_moves(folded)
    # ConvertLayout and the folding keep the convs in binding order: the plan's indices.
    winograd_calls = [(call, tiles[i]) for i, call in enumerate(conv_calls(folded)) if i in tiles]
    custom = {_CONV2D: functools.partial(_legalize_conv2d, winograd_calls=winograd_calls, pad_apart=PAD_APART,
                                         wide=wide_blocks(target), sole_reader=sole_readers(folded["main"])),
              _LAYOUT_TRANSFORM: _legalize_layout_transform}  # fmt: skip
    if cpu:
        custom.update(FAST_MATH)
        custom[_SOFTMAX] = _legalize_softmax
        custom["relax.image.resize2d"] = legalize_resize2d
        custom["relax.multiply"] = legalize_gate_multiply(gate_vars(folded["main"]))
        custom[_MATMUL] = _legalize_matmul(vector_lanes(target))
    legalize = tvm.transform.Sequential([
        *dispatch,
        relax.transform.LegalizeOps(customize_legalize_map=custom),
        relax.transform.FoldConstant(),
    ])  # fmt: skip
    with target, tvm.transform.PassContext(opt_level=3):
        out = legalize(folded)
    logger.info("layout plan %s: %d of %d convs converted, %d by Winograd", plan, converted, len(wanted),
                len(winograd_calls))  # fmt: skip
    return out
