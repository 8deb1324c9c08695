"""bf16: conv2d and matmul read bfloat16 inputs and weights and accumulate in float32.

Every other operator stays float32, and so do the outputs of the converted ones (their
``out_dtype``), so a bias, a residual add or a softmax after them sees float32. Constant
weights are converted once, here, at compile time. A matmul by a constant 2-D weight
``[K, N]`` (every dense layer) becomes ``matmul_bf16``, whose weight is pre-packed as
``[N/b, K/2, b, 2]`` (:func:`pack_weight`): the pairs of reduction elements that one
``vdpbf16ps`` lane multiplies and adds are adjacent, the 16 output columns of one register
are one contiguous load (template ``x86-dense-bf16``), and so is a 16-row AMX B tile's row
(``x86-dense-amx-bf16``), whose rows lie ``4b`` bytes apart. A matmul of two activations
(attention's) packs the second the same way where it is made, as part of the transpose
that makes it, and takes the same templates.

An activation that a conv reads in bf16 and another operator in fp32 (ResNet's block
output: the next conv and the residual add), or that several convs read (a stage's first
block: its conv and the downsample conv), is rounded to bf16 once, where it is made, and
an fp32 reader widens that copy (:func:`round_shared_activations`): the cast then fuses
into the producing operator's epilogue, instead of a function of its own that reads the
fp32 tensor back, and the residual is read at half the bytes.

Where the CPU's ``vdpbf16ps`` does fewer flops than its float32 FMAs and it has no AMX
(:func:`tuner.precision.bf16_arithmetic`: Intel cores; an Emerald Rapids retired 89-92
GFLOP/s a core on it against 183-188 on ``vfmadd231ps``, ``benchmarks/dot_rate.c``), bf16 arithmetic
would be the slow choice: there the weights are rounded to bf16 and the operators stay
float32 (``fp32_arithmetic``), so the float32 templates run them. The products of
bf16-rounded weights are as a bf16 kernel's; the activations keep float32's precision.
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import tvm
from numpy.typing import DTypeLike
from tvm import relax, te
from tvm.ir.expr import Constant

from tuner.graph.fold import fold_constants

logger = logging.getLogger(__name__)

BF16 = "bfloat16"
PACKED_MATMUL = "matmul_bf16"
# Reduction elements per vdpbf16ps lane.
PAIR = 2


def column_block(n: int) -> int:
    """Columns per block of a packed weight (:func:`pack_weight`) of ``n`` columns: 64, or
    the widest of 32 and 16 that divides ``n``; ``n`` itself (one block) where 16 does not."""
    return next((b for b in (64, 32, 16) if n % b == 0), n)


def packed_shape(k: int, n: int, elements: int = PAIR) -> tuple[int, int, int, int]:
    """The shape of a ``[K, N]`` weight packed by :func:`pack_weight`."""
    b = column_block(n)
    return n // b, k // elements, b, elements


def pack_weight(weight: np.ndarray, elements: int = PAIR, dtype=ml_dtypes.bfloat16) -> np.ndarray:
    """A ``[K, N]`` weight as ``dtype`` ``[N/b, K/e, b, e]`` (``out[n // b, k // e, n % b,
    k % e]``, ``b`` = :func:`column_block`): the ``e`` reduction elements one lane of a
    dot-product instruction adds are adjacent, and each block of ``b`` columns is one
    contiguous stream along the reduction. Rows ``N e`` elements apart (``[K/e, N, e]``, up
    to the thirtieth session) put every row of an AMX B tile on its own 4 KB page (12 KB
    apart for BERT's 3072 columns); BERT's dense layers on AMX took 0.66-0.81x that
    layout's time in blocks, their weights flushed (``benchmarks/amx_dense_blocks.py``)."""
    k, n = weight.shape
    blocks, groups, b, _ = packed_shape(k, n, elements)
    pairs = weight.astype(dtype).reshape(groups, elements, blocks, b)
    return np.ascontiguousarray(pairs.transpose(2, 0, 3, 1))


def packed_matmul(a: te.Tensor, w: te.Tensor, out_dtype: str = "float32", name: str = PACKED_MATMUL) -> te.Tensor:
    """``a @ W`` summed in ``out_dtype`` for ``a[..., K]`` and a packed ``w[..., N/b, K/e, b,
    e]`` (:func:`pack_weight`; bfloat16 pairs here, uint8 x int8 quadruples for int8,
    :mod:`tuner.precision.qdq`). A batched ``w`` (an attention matmul's second activation,
    :func:`pack_activation`) has ``a``'s batch dimensions before those."""
    *batch, blocks, groups, block, elements = (int(d) for d in w.shape)
    ko = te.reduce_axis((0, groups), "ko")
    ki = te.reduce_axis((0, elements), "ki")

    def body(*idx):
        j = idx[-1]
        return te.sum(
            a[(*idx[:-1], ko * elements + ki)].astype(out_dtype)
            * w[(*idx[:len(batch)], j // block, ko, j % block, ki)].astype(out_dtype),
            axis=[ko, ki],
        )

    return te.compute((*a.shape[:-1], blocks * block), body, name=name)


def emit_weight_matmul(
    builder: relax.BlockBuilder, a: relax.Var, weight: np.ndarray, elements: int, dtype: DTypeLike, out_dtype: str,
    name: str, *, columns: int | None = None,
) -> relax.Expr:
    """``a @ weight`` by :func:`packed_matmul`, emitted into ``builder``, for a constant ``[K,
    N]`` ``weight`` packed as ``dtype`` in groups of ``elements``. Columns are padded with zero
    weights up to a multiple of ``columns`` (default: whole 16-lane vectors) and sliced off
    after (ResNet-50's 1000 classes: 1008), so a classifier gets the packed layout the
    dot-product templates read instead of one 1000-column block that no vector divides."""
    from search_spaces.x86.intrin import DOT_LANES

    n = weight.shape[1]
    padded = np.pad(weight, ((0, 0), (0, -n % (columns or DOT_LANES))))
    packed = relax.const(pack_weight(padded, elements, dtype), str(np.dtype(dtype)))
    acc = builder.call_te(packed_matmul, a, packed, out_dtype, name, primfunc_name_hint=name)
    if padded.shape[1] == n:
        return acc
    last = len(a.ty.shape.values) - 1
    return builder.emit(relax.op.strided_slice(acc, axes=[last], begin=[0], end=[n]))


def _const_value(expr: relax.Expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, Constant) else None


@relax.expr_functor.mutator
class _ToBF16(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, fp32_arithmetic: bool = False) -> None:
        super().__init__(mod)
        self.fp32_arithmetic = fp32_arithmetic
        self.converted = {"conv2d on bf16 weights": 0, "matmul on bf16 weights": 0, "conv2d": 0,
                          "conv2d with a zero input channel": 0, "matmul": 0, "packed matmul": 0,
                          "packed activation matmul": 0}  # fmt: skip
        # The bf16 copy of each activation that packed matmuls read: BERT's query, key and
        # value projections read one layer-norm output, cast once instead of three times.
        self._lhs: dict[relax.Var, relax.Var] = {}

    def visit_dataflow_block_(self, block: relax.DataflowBlock) -> relax.BindingBlock:
        self._lhs = {}  # a dataflow variable lives in its own block
        return super().visit_dataflow_block_(block)

    def visit_binding_block_(self, block: relax.BindingBlock) -> relax.BindingBlock:
        self._lhs = {}
        return super().visit_binding_block_(block)

    def _bf16(self, expr: relax.Expr) -> relax.Expr:
        value = _const_value(expr)
        if value is not None:  # a weight: converted once, now
            return relax.const(value.astype(ml_dtypes.bfloat16), BF16)
        return relax.op.astype(expr, BF16)

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ("relax.nn.conv2d", "relax.matmul"):
            return call
        if any(str(a.ty.dtype) != "float32" for a in call.args[:2]):
            return call
        a, b = call.args[0], call.args[1]
        if self.fp32_arithmetic:
            return self._rounded_weight(call)
        if call.op.name == "relax.nn.conv2d":
            at = call.attrs
            self.converted["conv2d"] += 1
            data, weight = self._bf16(a), b
            value = _const_value(b)
            if value is not None and value.shape[1] % PAIR and int(at.groups) == 1 and str(at.data_layout) == "NCHW" \
                    and str(at.kernel_layout) == "OIHW":
                # An odd number of input channels (an RGB stem) gets a zero channel, so that
                # vdpbf16ps's channel pairs fit it (x86-conv2d-nchwc-dot).
                self.converted["conv2d with a zero input channel"] += 1
                data = relax.op.nn.pad(data, [0, 0, 0, 1, 0, 0, 0, 0])
                weight = relax.const(np.pad(value, ((0, 0), (0, 1), (0, 0), (0, 0))))
            return relax.op.nn.conv2d(
                data, self._bf16(weight), strides=at.strides, padding=at.padding, dilation=at.dilation,
                groups=int(at.groups), data_layout=str(at.data_layout), kernel_layout=str(at.kernel_layout),
                out_layout=str(at.out_layout) if at.out_layout else None, out_dtype="float32",
            )  # fmt: skip
        weight = _const_value(b)
        if weight is not None and weight.ndim == 2 and weight.shape[0] % PAIR == 0:
            self.converted["packed matmul"] += 1
            return emit_weight_matmul(self.builder_, self._bf16_lhs(a), weight, PAIR, ml_dtypes.bfloat16, "float32",
                                      PACKED_MATMUL)
        if weight is None and packable_activation(a, b):
            # Attention's two matmuls: the second activation is packed in pairs as a weight
            # is, where it is made (the packing fuses into the transpose that makes it), so
            # they run on vdpbf16ps (x86-dense-bf16) instead of widened to float32 FMAs.
            self.converted["packed activation matmul"] += 1
            packed = pack_activation(self.builder_, self.builder_.emit(self._bf16(b)))
            return self.builder_.call_te(packed_matmul, self._bf16_lhs(a), packed, primfunc_name_hint=PACKED_MATMUL)
        self.converted["matmul"] += 1
        return relax.op.matmul(self._bf16(a), self._bf16(b), out_dtype="float32")

    def _rounded_weight(self, call: relax.Call) -> relax.Expr:
        """``call`` with its constant weight rounded to bf16 and kept float32 (``fp32_arithmetic``)."""
        weight = _const_value(call.args[1])
        if weight is None:  # two activations (attention): float32 as they are
            return call
        kind = "conv2d" if call.op.name == "relax.nn.conv2d" else "matmul"
        self.converted[f"{kind} on bf16 weights"] += 1
        rounded = relax.const(weight.astype(ml_dtypes.bfloat16).astype(np.float32))
        return relax.Call(call.op, [call.args[0], rounded, *call.args[2:]], call.attrs, call.ty_args)

    def _bf16_lhs(self, a: relax.Expr) -> relax.Var:
        """``a`` cast to bf16 and bound (call_te takes bound variables), once per variable."""
        lhs = self._lhs.get(a) if isinstance(a, relax.Var) else None
        if lhs is None:
            lhs = self.builder_.emit(self._bf16(a))
            if isinstance(a, relax.Var):
                self._lhs[a] = lhs
        return lhs

def pack_activation(builder: relax.BlockBuilder, b: relax.Var) -> relax.Var:
    """A bf16 activation ``b[..., K, N]`` as ``[..., N/b, K/2, b, 2]`` (:func:`pack_weight`'s
    layout), emitted into ``builder``: a reshape and a transpose, which fuse into the operator
    that makes ``b``."""
    *batch, k, n = (int(d) for d in b.ty.shape)
    blocks, groups, block, _ = packed_shape(k, n)
    pairs = builder.emit(relax.op.reshape(b, (*batch, groups, PAIR, blocks, block)))
    r = len(batch)
    return builder.emit(relax.op.permute_dims(pairs, [*range(r), r + 2, r, r + 3, r + 1]))


def packable_activation(a: relax.Expr, b: relax.Expr) -> bool:
    """Whether ``a @ b`` of two float32 activations can take ``b`` packed in pairs: static
    shapes, the same batch dimensions (no broadcasting), an even K and whole 16-lane column
    vectors (x86-dense-bf16's)."""
    from search_spaces.x86.intrin import DOT_LANES

    shapes = [getattr(x.ty, "shape", None) for x in (a, b)]
    if any(s is None or not all(isinstance(d, tvm.tirx.IntImm) for d in s) for s in shapes):
        return False
    sa, sb = ([int(d) for d in s] for s in shapes)
    return (len(sa) == len(sb) >= 3 and sa[:-2] == sb[:-2] and sa[-1] == sb[-2]
            and sb[-2] % PAIR == 0 and sb[-1] % DOT_LANES == 0)  # fmt: skip


def _bf16_cast_source(expr: relax.Expr) -> relax.DataflowVar | None:
    """The float32 dataflow variable ``expr`` casts to bfloat16, if it is such a cast."""
    if not (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.astype"):
        return None
    src = expr.args[0]
    if str(expr.attrs.dtype) != BF16 or not isinstance(src, relax.DataflowVar) or str(src.ty.dtype) != "float32":
        return None
    return src


def _shared_activations(func: relax.Function) -> set[relax.DataflowVar]:
    """float32 dataflow variables cast to bfloat16 for convs only, and read otherwise or cast
    more than once.

    Only conv inputs: rounding BERT's residual stream (the layer-norm outputs that the
    projections read in bf16) cost accuracy, top-1 agreement with fp32 97.6% instead of 99.2%
    (benchmarks/README.md), where ResNet-50's residuals lost none.
    """
    casts: dict[relax.DataflowVar, list[relax.Var]] = {}
    read: set[relax.Var] = set()
    conv_operands: set[relax.Var] = set()
    other_operands: set[relax.Var] = set()

    def note(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Var):
            read.add(expr)

    for block in func.body.blocks:
        for binding in block.bindings:
            src = _bf16_cast_source(binding.value)
            if src is not None:
                casts.setdefault(src, []).append(binding.var)
                continue
            relax.analysis.post_order_visit(binding.value, note)
            value = binding.value
            is_conv = isinstance(value, relax.Call) and getattr(value.op, "name", None) == "relax.nn.conv2d"
            operands = [a for a in getattr(value, "args", ()) if isinstance(a, relax.Var)]
            (conv_operands if is_conv else other_operands).update(operands)
    relax.analysis.post_order_visit(func.body.body, note)
    return {v for v, copies in casts.items()
            if (len(copies) > 1 or v in read) and all(c in conv_operands and c not in other_operands for c in copies)}


@relax.expr_functor.mutator
class _RoundShared(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, shared: set[relax.DataflowVar]) -> None:
        super().__init__(mod)
        self.shared = shared
        self.copies: dict[relax.DataflowVar, relax.Var] = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        src = _bf16_cast_source(binding.value)
        if src is not None and src in self.copies:  # the one bf16 copy, made where src was
            self.set_var_remap(binding.var, self.copies[src])
            return
        super().visit_var_binding_(binding)
        if binding.var not in self.shared:
            return
        made = self.get_var_remap(binding.var) or binding.var
        copy = self.builder_.emit(relax.op.astype(made, BF16))
        self.copies[binding.var] = copy
        # Every float32 reader sees the rounded value: one tensor, one precision.
        self.set_var_remap(binding.var, self.builder_.emit(relax.op.astype(copy, "float32")))


def round_shared_activations(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with every float32 activation that convs read in bfloat16 and another operator
    reads (or several convs do) made once in bfloat16 and widened for its float32 readers;
    and how many such activations there were."""
    funcs = [(gv, f) for gv, f in mod.functions_items()
             if isinstance(f, relax.Function) and isinstance(f.body, relax.SeqExpr)]  # fmt: skip
    shared = set().union(*(_shared_activations(f) for _, f in funcs))
    if not shared:
        return mod, 0
    mutator = _RoundShared(mod, shared)
    for gv, func in funcs:
        mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get()), len(shared)


def to_bf16(mod: tvm.IRModule, fp32_arithmetic: bool = False) -> tvm.IRModule:
    """``mod`` (bound: weights as constants) with bf16 conv2d and matmul, float32 elsewhere;
    with ``fp32_arithmetic``, float32 conv2d and matmul on weights rounded to bf16."""
    return _convert(mod, fp32_arithmetic)[0]


def bf16_summary(mod: tvm.IRModule, fp32_arithmetic: bool = False, why: str = "") -> str:
    """One line: what :func:`to_bf16` converts in ``mod`` (``why``: the reason for
    ``fp32_arithmetic``)."""
    counts = _convert(mod, fp32_arithmetic)[1]
    done = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing converted"
    if fp32_arithmetic:
        return f"bf16: {done}, computed on fp32 FMAs ({why}); activations and every other operator in fp32"
    return f"bf16: {done}; every other operator in fp32"


def _convert(mod: tvm.IRModule, fp32_arithmetic: bool = False) -> tuple[tvm.IRModule, dict[str, int]]:
    from search_spaces.x86.intrin import register_intrinsics

    # Records of x86-dense-bf16 replay a tensorize by the intrinsic's name.
    register_intrinsics()
    mod = fold_constants(mod)  # weights reach the calls as constants (no permute_dims left)
    mutator = _ToBF16(mod, fp32_arithmetic)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    out = relax.transform.DeadCodeElimination()(mutator.builder_.get())
    if not fp32_arithmetic:
        out, mutator.converted["activations kept in bf16"] = round_shared_activations(out)
    logger.info("bf16: %s", ", ".join(f"{n} {k}" for k, n in mutator.converted.items()))
    return out, mutator.converted
