"""Constant folding of weight arithmetic in numpy, before TVM's passes see the graph.

Relax's ``FoldConstant`` evaluates every call whose arguments are constants by building it
with LLVM, one module per call: on ResNet-50 the batch-norm arithmetic and weight re-layouts
are about 320 such calls, 10 to 12 s of a 20 s compile on this project's 2-core machines (and
the same again in every task extraction). The arithmetic is trivial, so the ops that weight
preparation produces (elementwise arithmetic, reshapes, transposes, layout transforms) are
evaluated here in numpy, in milliseconds; whatever is not in the table is left for TVM.
A QDQ model's weight ``dequantize`` calls are too (BERT-base has 96).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant

logger = logging.getLogger(__name__)

_Impl = Callable[[relax.Call, list[Any]], np.ndarray]


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> _Impl:
    return lambda call, a: fn(a[0], a[1])


def _reshape(call: relax.Call, a: list[Any]) -> np.ndarray:
    return a[0].reshape(a[1])


def _permute(call: relax.Call, a: list[Any]) -> np.ndarray:
    axes = call.attrs.axes
    return np.transpose(a[0], None if axes is None else [int(x) for x in axes])


def _expand_dims(call: relax.Call, a: list[Any]) -> np.ndarray:
    return np.expand_dims(a[0], tuple(int(x) for x in call.attrs.axis))


def _squeeze(call: relax.Call, a: list[Any]) -> np.ndarray:
    axis = call.attrs.axis
    return np.squeeze(a[0], None if axis is None else tuple(int(x) for x in axis))


def _astype(call: relax.Call, a: list[Any]) -> np.ndarray:
    return a[0].astype(str(call.attrs.dtype))


def _layout_transform(call: relax.Call, a: list[Any]) -> np.ndarray:
    x = a[0]
    index_map = call.attrs.index_map
    if call.attrs.pad_value is not None or len(index_map.initial_indices) != x.ndim:
        raise _Unsupported("padded layout transform")
    grid = np.indices(x.shape, dtype=np.int64)
    env = {v: grid[k] for k, v in enumerate(index_map.initial_indices)}
    dest = [np.broadcast_to(_eval_index(e, env), x.shape) for e in index_map.final_indices]
    out_shape = tuple(int(d.max()) + 1 for d in dest) if x.size else ()
    if int(np.prod(out_shape)) != x.size:
        raise _Unsupported("layout transform that pads or drops elements")
    out = np.empty(out_shape, dtype=x.dtype)
    out[tuple(dest)] = x
    return out


def _dequantize(call: relax.Call, a: list[Any]) -> np.ndarray:
    """``(q - zero_point) * scale`` as TVM lowers it (int32 difference, one float32 multiply),
    per tensor or along ``axis``: a QDQ model's weights arrive as int8 initializers."""
    q, scale, zero = np.asarray(a[0]), np.asarray(a[1], np.float32), np.asarray(a[2])
    if str(call.attrs.out_dtype) != "float32":
        raise _Unsupported("dequantize to a type other than float32")
    if scale.size > 1 or zero.size > 1:
        shape = [1] * q.ndim
        shape[int(call.attrs.axis) % q.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape if zero.size > 1 else [1] * q.ndim)
    return (q.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * scale


class _Unsupported(Exception):
    """An op or attribute the numpy folder does not evaluate; TVM's FoldConstant will."""


def _eval_index(expr: Any, env: dict) -> np.ndarray:
    """Evaluate an integer index expression of an IndexMap over numpy index grids."""
    if isinstance(expr, tirx.Var):
        return env[expr]
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    ops = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply,
           tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod}  # fmt: skip
    for kind, fn in ops.items():
        if isinstance(expr, kind):
            return fn(_eval_index(expr.a, env), _eval_index(expr.b, env))
    raise _Unsupported(f"index expression {type(expr).__name__}")


_OPS: dict[str, _Impl] = {
    "relax.add": _binary(np.add),
    "relax.subtract": _binary(np.subtract),
    "relax.multiply": _binary(np.multiply),
    "relax.divide": _binary(np.divide),
    "relax.sqrt": lambda call, a: np.sqrt(a[0]),
    "relax.rsqrt": lambda call, a: 1.0 / np.sqrt(a[0]),
    "relax.negative": lambda call, a: np.negative(a[0]),
    "relax.reshape": _reshape,
    "relax.permute_dims": _permute,
    "relax.expand_dims": _expand_dims,
    "relax.squeeze": _squeeze,
    "relax.astype": _astype,
    "relax.layout_transform": _layout_transform,
    "relax.dequantize": _dequantize,
}


@relax.expr_functor.mutator
class _NumpyFolder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.folded = 0

    def _value(self, arg: relax.Expr) -> Any:
        if isinstance(arg, relax.Var):
            bound = self.lookup_binding(arg)
            if bound is None:
                raise _Unsupported("not a constant")
            arg = bound
        if isinstance(arg, (tirx.IntImm, tirx.FloatImm)):  # a relax.prim_value
            return arg.value
        if isinstance(arg, Constant):
            return arg.value.numpy()
        if isinstance(arg, relax.ShapeExpr):
            return tuple(int(d) for d in arg.values)
        raise _Unsupported("not a constant")

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        impl = _OPS.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        ty = getattr(call, "ty", None)
        if impl is None or not isinstance(ty, relax.TensorType) or ty.shape is None:
            return call
        try:
            args = [self._value(a) for a in call.args]
            value = np.asarray(impl(call, args)).astype(str(ty.dtype), copy=False)
        except _Unsupported:
            return call
        expected = tuple(int(d) for d in ty.shape.values)
        if value.shape != expected:
            logger.debug("numpy fold of %s gave %s, expected %s; left to TVM", call.op.name, value.shape, expected)
            return call
        self.folded += 1
        return relax.const(np.ascontiguousarray(value), str(ty.dtype))


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """Evaluate weight arithmetic on constants in numpy, then remove what became dead.

    Every Relax function of ``mod`` is rewritten; calls of ops outside the table, or on
    non-constant arguments, are kept as they are.
    """
    folder = _NumpyFolder(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(gv, folder.visit_expr(func))
    out = relax.transform.DeadCodeElimination()(folder.builder_.get())
    logger.debug("folded %d constant calls in numpy", folder.folded)
    return out
