"""int8 from quantized (QDQ) models: dequantize -> conv2d/matmul chains as integer operators.

An ONNX model that onnxruntime's ``quantize_static`` wrote in the QDQ format imports as
``quantize``/``dequantize`` pairs around float operators. By the time a model is bound
(:meth:`tuner.frontends.ModelSpec.bound`), TVM's constant folding has turned each weight's
``dequantize`` into its float32 values, while each activation's ``dequantize(q, scale,
zero_point)`` stays. A conv2d or matmul reading such an activation and a constant weight is
rewritten as::

    acc = conv2d(int16(q) - zero_point, int16(w_q), out_dtype=int32)   # exact integer sums
    out = float32(acc) * (scale * w_scale[channel])                     # requantize

where ``w_q``, ``w_scale`` are the weight's per-output-channel int8 values and scales,
recovered exactly (the symmetric ``max |w| / 127`` scale ``quantize_static`` uses; a weight
whose values are not ``int8 x scale`` is left alone). The bias add and the next
``quantize`` stay as they are and fuse into the operator's task: the requantize epilogue.
Operands fit int16 (``uint8 - zero_point`` and int8), so the sums are exact in int32. A
conv (one group) whose activation is uint8 reads ``q`` and ``w_q`` as they are, uint8 x
int8, which the blocked layout hands to ``vpdpbusd`` (``tuner.graph.layout.plan.dot_elements``,
template ``x86-conv2d-nchwc-dot``): with zero point 0 (every conv after a ReLU) directly,
with another (ResNet's stem) as ``conv2d(pad(q, zero_point), w_q) - zero_point * sum(w_q)``
(:meth:`_ToInt8._uint8_conv`). A matmul by a constant weight does too, whatever the zero
point, ``q @ w_q - zero_point * colsum(w_q)`` with ``w_q`` packed ``[N/b, K/4, b, 4]`` (template
``x86-dense-vnni``). Grouped convs with a zero point other than 0 stay int16. A matmul of
two quantized activations (attention's) runs on bf16 dot products where the target has
them, exactly (:meth:`_ToInt8._activation_matmul`).

Last, the remaining per-tensor ``quantize``/``dequantize`` calls are written out as the
elementwise operators TVM would lower them to (:func:`qdq_as_elementwise`): Relax infers no
layout for them, and they would put a layout transform on each side of every quantize.

What is not this pattern stays float32 and is reported (:class:`Int8Rewrite`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

logger = logging.getLogger(__name__)

_OPS = ("relax.nn.conv2d", "relax.matmul")
# Operand dtype of the integer operators: holds uint8 - zero point and int8 exactly.
_OPERAND = "int16"
# A matmul by a constant weight: uint8 x int8 with the weight packed [N/b, K/4, b, 4] (vpdpbusd).
INT8_MATMUL = "matmul_u8s8"
# A matmul of two quantized activations, on bf16 dot products (_ToInt8._activation_matmul).
ACTIVATION_MATMUL = "matmul of two activations on bf16 dots"
# float32 holds every integer below this.
_EXACT_FLOAT32 = 2**24
# Largest relative difference between a weight and its int8 reconstruction that still
# counts as "this weight was quantized" (float32 rounding of w_q * scale).
_EXACT = 1e-5


@dataclass
class Int8Rewrite:
    """The rewritten module and what the pass did.

    Attributes:
        mod: the module with integer operators where the pattern matched.
        rewritten: per operator (``conv2d``, ``matmul``), how many became integer.
        unhandled: one line per conv2d/matmul left in float32, saying why.
    """

    mod: tvm.IRModule
    rewritten: dict[str, int] = field(default_factory=dict)
    unhandled: list[str] = field(default_factory=list)
    #: conv2d/matmul whose 8-bit weights the target's int8 dot product would saturate
    #: (``pair_limit``): integer, but off the dot product.
    saturating: int = 0

    def describe(self) -> str:
        """One line for the terminal."""
        done = ", ".join(f"{n} {op}" for op, n in self.rewritten.items() if n) or "nothing"
        slow = ("" if not self.saturating else
                f"; {self.saturating} with 8-bit weights, which this CPU's int8 dot product (vpmaddubsw, int16 "
                "pair sums) would saturate, run without it: quantize with reduce_range=True (7-bit weights) "
                "for speed")  # fmt: skip
        if not self.unhandled:
            return f"int8: rewrote {done}{slow}"
        why = "; ".join(sorted(set(self.unhandled)))
        return f"int8: rewrote {done}{slow}; {len(self.unhandled)} left in fp32 ({why})"


def quantize_weight(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Symmetric per-channel int8 values and scales of ``weight`` along ``axis``, or None
    when ``weight`` is not (to float32 rounding) int8 values times those scales.

    A channel's largest magnitude is ``n`` steps of its scale for some ``n <= 127``: 127 for
    full-range weights, 63 or 64 for onnxruntime's ``reduce_range`` (7-bit weights, what it
    advises on CPUs without VNNI). The largest ``n`` that puts every weight on the grid wins;
    any grid that fits gives the same products.
    """
    moved = np.moveaxis(weight.astype(np.float64), axis, 0).reshape(weight.shape[axis], -1)
    peak = np.max(np.abs(moved), axis=1)
    peak[peak == 0] = 1.0
    tol = _EXACT * max(float(np.max(np.abs(moved))), 1e-30)
    scale = np.zeros(len(peak))
    q = np.zeros_like(moved)
    left = np.arange(len(peak))
    for n in range(127, 0, -1):
        s = peak[left] / n
        qn = np.rint(moved[left] / s[:, None])
        fits = np.max(np.abs(qn * s[:, None] - moved[left]), axis=1) <= tol
        scale[left[fits]], q[left[fits]] = s[fits], qn[fits]
        left = left[~fits]
        if not len(left):
            break
    if len(left):
        return None
    q = np.moveaxis(q.reshape(np.moveaxis(weight, axis, 0).shape), 0, axis)
    return q.astype(np.int8), scale.astype(np.float32)


def _scalar(expr: relax.Expr) -> float | None:
    if isinstance(expr, Constant):
        value = expr.value.numpy()
        if value.size == 1:
            return float(value.reshape(()))
    return None


@relax.expr_functor.mutator
class _ToInt8(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, bf16_dots: bool, pair_limit: bool = False) -> None:
        super().__init__(mod)
        self.bf16_dots = bf16_dots
        self.pair_limit = pair_limit
        self.report = Int8Rewrite(mod, {"conv2d": 0, "matmul": 0, ACTIVATION_MATMUL: 0})

    def _dequantized(self, expr: relax.Expr) -> relax.Call | None:
        if isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.dequantize":
            return expr
        return None

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _OPS:
            return call
        name = call.op.name.split(".")[-1]
        deq = self._dequantized(call.args[0])
        weight = call.args[1]
        if deq is None:
            self.report.unhandled.append(f"{name}: input not dequantized")
            return call
        sx, zx = _scalar(deq.args[1]), _scalar(deq.args[2])
        if sx is None or zx is None:
            self.report.unhandled.append(f"{name}: per-channel activation scale")
            return call
        deq_w = self._dequantized(weight) if name == "matmul" else None
        if deq_w is not None:
            return self._activation_matmul(call, deq, deq_w)
        if not isinstance(weight, Constant) or str(weight.ty.dtype) != "float32":
            self.report.unhandled.append(f"{name}: weight not a constant")
            return call
        w = weight.value.numpy()
        if name == "conv2d":
            at = call.attrs
            if str(at.data_layout) != "NCHW" or str(at.kernel_layout) != "OIHW":
                self.report.unhandled.append("conv2d: layout other than NCHW/OIHW")
                return call
            axis, shape = 0, (1, w.shape[0], 1, 1)
        else:
            if w.ndim != 2:
                self.report.unhandled.append("matmul: weight not 2-D")
                return call
            axis, shape = 1, (w.shape[1],)
        quantized = quantize_weight(w, axis)
        if quantized is None:
            self.report.unhandled.append(f"{name}: weight not int8 x per-channel scale")
            return call
        wq, sw = quantized
        q = deq.args[0]
        scale = relax.const((np.float32(sx) * sw).reshape(shape).astype(np.float32), "float32")
        exact = not self.pair_limit or _pairs_exact(wq, 0 if name == "matmul" else 1)
        dense = int(getattr(call.attrs, "groups", 1)) == 1  # a grouped conv has no dot product
        self.report.saturating += not exact and str(q.ty.dtype) == "uint8" and dense
        if name == "matmul" and str(q.ty.dtype) == "uint8" and _packable(wq) and exact:
            acc = self._packed_matmul(q, wq, int(zx))
            self.report.rewritten[name] += 1
            return relax.op.multiply(relax.op.astype(acc, "float32"), scale)
        if name == "conv2d" and str(q.ty.dtype) == "uint8" and int(call.attrs.groups) == 1:
            acc = self._uint8_conv(q, wq, int(zx), call.attrs)
            self.report.rewritten[name] += 1
            return relax.op.multiply(relax.op.astype(acc, "float32"), scale)
        if name == "conv2d" and zx == 0 and str(q.ty.dtype) == "uint8":
            x, operand = q, "int8"  # uint8 x int8 (a grouped conv: x86-depthwise-conv2d-nchwc)
        else:
            x = relax.op.astype(q, _OPERAND)
            if zx != 0:
                x = relax.op.subtract(x, relax.const(int(zx), _OPERAND))
            x, operand = self.builder_.emit(x), _OPERAND
        w_const = relax.const(wq.astype(operand), operand)
        if name == "conv2d":
            at = call.attrs
            acc = relax.op.nn.conv2d(
                x, w_const, strides=at.strides, padding=at.padding, dilation=at.dilation, groups=int(at.groups),
                data_layout="NCHW", kernel_layout="OIHW", out_dtype="int32",
            )  # fmt: skip
        else:
            acc = relax.op.matmul(x, w_const, out_dtype="int32")
        acc = self.builder_.emit(acc)
        self.report.rewritten[name] += 1
        return relax.op.multiply(relax.op.astype(acc, "float32"), scale)

    def _activation_matmul(self, call: relax.Call, deq_a: relax.Call, deq_b: relax.Call) -> relax.Expr:
        """``dequantize(qa) @ dequantize(qb)`` (attention's two matmuls) as ``((qa - za) @ (qb
        - zb)) * sa sb`` on bf16 dot products, ``qb - zb`` packed where it is made
        (:func:`~tuner.precision.bf16.pack_activation`): templates ``x86-dense-bf16`` and
        ``x86-dense-amx-bf16``.

        Exact, the integer matmul ONNX Runtime computes: ``q - z`` is an integer of at most
        255 in magnitude, which bfloat16 holds; each product and every partial sum is an
        integer below 2**24 (checked: reduction length x the operands' largest magnitudes),
        which float32 holds, in whatever order the instruction adds them. Left in float32
        where the target has no bf16 dot product (no AVX512_BF16 or AMX-BF16).
        """
        from tuner.precision.bf16 import BF16, PACKED_MATMUL, pack_activation, packable_activation, packed_matmul

        a, b = call.args[0], call.args[1]
        if not self.bf16_dots:
            self.report.unhandled.append("matmul: two activations, and no bf16 dot product on the target")
            return call
        params = [(_scalar(d.args[1]), _scalar(d.args[2])) for d in (deq_a, deq_b)]
        if any(s is None or z is None for s, z in params):
            self.report.unhandled.append("matmul: per-channel activation scale")
            return call
        if not packable_activation(a, b):
            self.report.unhandled.append("matmul: two activations of shapes the packed matmul does not take")
            return call
        reach = 1
        for d, (_, z) in zip((deq_a, deq_b), params, strict=True):
            info = np.iinfo(str(d.args[0].ty.dtype))
            reach *= max(z - info.min, info.max - z)
        if int(b.ty.shape[-2]) * reach >= _EXACT_FLOAT32:
            self.report.unhandled.append("matmul: two activations whose sums pass float32's exact integers")
            return call
        centered = []
        for d, (_, z) in zip((deq_a, deq_b), params, strict=True):
            x = relax.op.astype(d.args[0], "float32")
            if z != 0:
                x = relax.op.subtract(x, _filled(z, d.args[0]))
            centered.append(self.builder_.emit(relax.op.astype(x, BF16)))
        packed = pack_activation(self.builder_, centered[1])
        acc = self.builder_.call_te(packed_matmul, centered[0], packed, primfunc_name_hint=PACKED_MATMUL)
        self.report.rewritten[ACTIVATION_MATMUL] += 1
        return relax.op.multiply(acc, _filled(params[0][0] * params[1][0], acc))

    def _uint8_conv(self, q: relax.Expr, wq: np.ndarray, zx: int, attrs) -> relax.Expr:
        """``conv2d(q - zx, wq)`` in int32 as uint8 x int8, what ``vpdpbusd`` takes
        (``tuner.graph.layout.plan.dot_elements``, template ``x86-conv2d-nchwc-dot``).

        Input channels that are not a multiple of the instruction's 4 (an RGB stem) get zero
        weights. A zero point other than 0 (the stem, whose input is not a ReLU's) is taken
        out after the sums, ``conv2d(q, wq) - zx * sum(wq)`` per output channel, with the
        border padded by ``zx`` rather than by the conv (a padded ``zx`` is a real 0): exact
        in int32. ResNet-50's stem widened to int16 ran at 360 GFLOP/s on a Zen 5, a third of
        OpenVINO's (``INFERENCE_PRECISION_HINT=f32``, running the file's int8 kernels) on the
        same QDQ file (benchmarks/README.md).
        """
        from search_spaces.x86.intrin import VNNI_DOT

        extra = -wq.shape[1] % VNNI_DOT.elements
        top, left, bottom, right = (int(p) for p in attrs.padding)
        spatial = (top, bottom, left, right) if zx else (0, 0, 0, 0)
        padding = (0, 0, 0, 0) if zx else (top, left, bottom, right)
        if extra or any(spatial):
            q = relax.op.nn.pad(q, [0, 0, 0, extra, *spatial], pad_value=float(zx))
            wq = np.pad(wq, ((0, 0), (0, extra), (0, 0), (0, 0)))
        acc = relax.op.nn.conv2d(
            q, relax.const(wq, "int8"), strides=attrs.strides, padding=padding, dilation=attrs.dilation,
            data_layout="NCHW", kernel_layout="OIHW", out_dtype="int32",
        )  # fmt: skip
        if zx:
            sums = zx * wq.astype(np.int32).sum(axis=(1, 2, 3))
            acc = relax.op.subtract(self.builder_.emit(acc), relax.const(sums.reshape(1, -1, 1, 1), "int32"))
        return self.builder_.emit(acc)

    def _packed_matmul(self, q: relax.Expr, wq: np.ndarray, zx: int) -> relax.Expr:
        """``(q - zx) @ wq`` in int32 as ``q @ wq - zx * colsum(wq)``: uint8 x int8 with the
        weight packed ``[N/b, K/4, b, 4]`` (:func:`~tuner.precision.bf16.pack_weight`: what vpdpbusd
        and tdpbusd read, templates ``x86-dense-vnni`` and ``x86-dense-amx-int8``); the
        correction is a constant per output column, exact in int32."""
        from search_spaces.x86.intrin import VNNI_DOT
        from tuner.precision.bf16 import emit_weight_matmul

        acc = emit_weight_matmul(self.builder_, q, wq, VNNI_DOT.elements, np.int8, "int32", INT8_MATMUL)
        if zx:
            acc = relax.op.subtract(acc, relax.const(zx * wq.astype(np.int32).sum(axis=0), "int32"))
        return acc


def _pairs_exact(wq: np.ndarray, axis: int) -> bool:
    """Whether AVX2's int8 dot product sums ``wq`` exactly along its reduction ``axis``
    (``intrin_x86.exact_for``). A conv's input channels are paired as its blocks pair them;
    ``tuner.graph.layout.plan.dot_elements`` checks the packed weights again."""
    from search_spaces.x86.intrin import AVX2_DOT, exact_for

    return exact_for(AVX2_DOT, wq, axis)


def _packable(wq: np.ndarray) -> bool:
    from search_spaces.x86.intrin import VNNI_DOT

    return wq.shape[0] % VNNI_DOT.elements == 0


def _filled(value: float, like: relax.Expr) -> relax.Constant:
    """``value`` as a float32 tensor along ``like``'s channels ((1, C, 1, 1) for an NCHW
    tensor, the last axis otherwise), not a scalar: TVM writes a scalar constant into the
    operator's code, so every layer's scale would make a task of its own (BERT-base: 173
    tasks instead of 15); a tensor is an argument, and the layers' tasks are one."""
    shape = getattr(like.ty, "shape", None)
    dims = [int(d) for d in shape.values] if isinstance(shape, relax.ShapeExpr) else []
    if not dims:
        return relax.const(value, "float32")
    filled = (1, dims[1], 1, 1) if len(dims) == 4 else (dims[-1],)
    return relax.const(np.full(filled, value, dtype=np.float32), "float32")


def qdq_as_elementwise(mod: tvm.IRModule) -> tvm.IRModule:
    """Per-tensor (scalar scale and zero point) ``quantize``/``dequantize`` as the elementwise
    operators of TVM's own legalization (``clip(round(x * (1 / s)) + zp)``, ``(q - zp) * s``),
    which follow any layout and fuse into their neighbours.

    Every step of an int8 operator's requantize epilogue runs once per output element, and
    in a 1x1 conv over 64 channels the epilogue is as long as the sums. So, each exact:

    - a max pool that a quantize reads runs after it, on the quantized values;
    - a ReLU before a quantize whose zero point is the dtype's lowest is dropped (the
      quantize's clip does it);
    - ``dequantize(quantize(x))`` whose quantized values nothing else reads (ONNX Runtime's
      QDQ pair around a conv's output, before its ReLU or residual add) stays float:
      ``clip(round(x / s), lo - zp, hi - zp) * s``, no conversion to uint8 and back;
    - a zero point of 0 is not added.

    Then :func:`fold_scales` multiplies each chain's constant scales together (not exact at
    half steps) and drops the clips the next clip makes idle.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def scalars(call: relax.Call) -> tuple[float, float] | None:
        s, z = _scalar(call.args[1]), _scalar(call.args[2])
        return None if s is None or z is None else (s, z)

    def rounded(x: relax.Expr, s: float, z: float, lo: float, hi: float) -> relax.Expr:
        # x * (1 / s) where TVM's legalization divides: a division (vdivps) per element in
        # every epilogue. The product is within an ulp of the quotient, so a value rounds the
        # other way only within an ulp of a half step.
        like = x  # typed, unlike the calls built here
        x = relax.op.round(relax.op.multiply(x, _filled(1 / s, like)))
        if z != 0:
            x = relax.op.add(x, _filled(z, like))
        # The dtype's bounds are the same in every layer; others are arguments (see _filled).
        bounds = [relax.const(b, "float32") if b in (0.0, 255.0, -128.0, 127.0) else _filled(b, like)
                  for b in (lo, hi)]  # fmt: skip
        return relax.op.minimum(relax.op.maximum(x, bounds[0]), bounds[1])

    def quantize(expr: relax.Call, _matches: dict) -> relax.Expr:
        params = scalars(expr)
        if params is None:
            return expr
        (s, z), dtype = params, str(expr.attrs.out_dtype)
        info = np.iinfo(dtype)
        return relax.op.astype(rounded(expr.args[0], s, z, float(info.min), float(info.max)), dtype)

    def dequantize(expr: relax.Call, _matches: dict) -> relax.Expr:
        params = scalars(expr)
        if params is None or str(expr.attrs.out_dtype) != "float32":
            return expr
        s, z = params
        x = relax.op.astype(expr.args[0], "float32")
        if z != 0:
            x = relax.op.subtract(x, _filled(z, expr.args[0]))
        return relax.op.multiply(x, _filled(s, expr.args[0]))

    pooled, relu_in, quantized = wildcard(), wildcard(), wildcard()
    pool = is_op("relax.nn.max_pool2d")(pooled)
    quantized_pair = is_op("relax.quantize")(quantized, wildcard(), wildcard())

    def pool_after_quantize(expr: relax.Call, matches: dict) -> relax.Expr:
        # A per-tensor quantize is monotone non-decreasing, so it commutes with a max (and
        # the pool's border, the dtype's lowest value, stays the lowest). The pool then reads
        # uint8 instead of float32 (ResNet-50's stem: 0.8 MB, not 3.2 MB).
        if scalars(expr) is None:
            return expr
        moved = relax.Call(expr.op, [matches[pooled], *expr.args[1:]], expr.attrs)
        return relax.Call(matches[pool].op, [moved], matches[pool].attrs)

    def without_relu(expr: relax.Call, matches: dict) -> relax.Expr:
        params = scalars(expr)
        if params is None or params[1] != np.iinfo(str(expr.attrs.out_dtype)).min:
            return expr
        return relax.Call(expr.op, [matches[relu_in], *expr.args[1:]], expr.attrs)

    def float_pair(single: list[relax.Call]) -> Callable[[relax.Call, dict], relax.Expr]:
        def fold(expr: relax.Call, matches: dict) -> relax.Expr:
            q = matches[quantized_pair]
            params = scalars(expr)
            if (params is None or params != scalars(q) or str(expr.attrs.out_dtype) != "float32"
                    or not any(q.same_as(c) for c in single)):  # fmt: skip
                return expr
            (s, z), info = params, np.iinfo(str(q.attrs.out_dtype))
            x = matches[quantized]
            return relax.op.multiply(rounded(x, s, 0.0, float(info.min) - z, float(info.max) - z), _filled(s, x))

        return fold

    funcs = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            func = rewrite_call(is_op("relax.quantize")(pool, wildcard(), wildcard()), pool_after_quantize, func)
            func = rewrite_call(is_op("relax.quantize")(is_op("relax.nn.relu")(relu_in), wildcard(), wildcard()),
                                without_relu, func)  # fmt: skip
            func = rewrite_call(is_op("relax.dequantize")(quantized_pair, wildcard(), wildcard()),
                                float_pair(_read_once(func, "relax.quantize")), func)  # fmt: skip
            func = rewrite_call(is_op("relax.quantize")(wildcard(), wildcard(), wildcard()), quantize, func)
            func = rewrite_call(is_op("relax.dequantize")(wildcard(), wildcard(), wildcard()), dequantize, func)
        funcs[gv] = func
    mod = relax.transform.FoldConstant()(tvm.IRModule(funcs, attrs=mod.attrs))
    return relax.transform.DeadCodeElimination()(fold_scales(mod))


def fold_scales(mod: tvm.IRModule) -> tvm.IRModule:
    """Fewer steps in the requantize epilogues: constant scales multiplied together, and a
    clip dropped where the clip after it does its work.

    - ``(x * a + b) * c`` becomes ``x * (a * c) + b * c`` (the conv's scale and bias, then
      the quantize's 1 / s: one multiply-add instead of a multiply-add and a multiply);
    - ``(x * a) * c`` becomes ``x * (a * c)`` (a dequantize's s, then the next quantize's 1 / s);
    - ``(x * a + y * b) * c`` becomes ``x * (a * c) + y * (b * c)`` (a residual add between
      two dequantizes, then its quantize);
    - in ``clip(round(clip(y, l1, h1) * k), l2, h2)`` with k > 0, the inner bound goes where
      the outer one makes it idle: ``l1 * k <= l2`` or ``h1 * k >= h2`` for every channel.

    The first three move a value by an ulp or so before its round, so one can land on the
    other side of a half step: ONNX Runtime's own int8 kernels multiply by one combined
    scale too. The last is exact.
    """
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, y, a, b, c = wildcard(), wildcard(), is_const(), is_const(), is_const()
    scaled = is_op("relax.multiply")(x, a)
    biased = is_op("relax.multiply")(is_op("relax.add")(scaled, b), c)
    twice = is_op("relax.multiply")(scaled, c)
    summed = is_op("relax.multiply")(is_op("relax.add")(scaled, is_op("relax.multiply")(y, b)), c)

    def value(matches: dict, pattern) -> np.ndarray:
        return matches[pattern].value.numpy()

    def times(matches: dict, one, other) -> relax.Constant:
        return relax.const((value(matches, one) * value(matches, other)).astype(np.float32), "float32")

    def floats(matches: dict, *consts) -> bool:
        # Only float32 scales: an integer chain would change type, and means something else.
        return all(value(matches, k).dtype == np.float32 for k in consts)

    def fold_biased(expr: relax.Call, m: dict) -> relax.Expr:
        if not floats(m, a, b, c):
            return expr
        return relax.op.add(relax.op.multiply(m[x], times(m, a, c)), times(m, b, c))

    def fold_twice(expr: relax.Call, m: dict) -> relax.Expr:
        if not floats(m, a, c):
            return expr
        return relax.op.multiply(m[x], times(m, a, c))

    def fold_summed(expr: relax.Call, m: dict) -> relax.Expr:
        if not floats(m, a, b, c):
            return expr
        return relax.op.add(relax.op.multiply(m[x], times(m, a, c)), relax.op.multiply(m[y], times(m, b, c)))

    l1, h1, k, l2, h2, inner = is_const(), is_const(), is_const(), is_const(), is_const(), wildcard()
    clip1 = is_op("relax.minimum")(is_op("relax.maximum")(inner, l1), h1)
    nested = is_op("relax.minimum")(
        is_op("relax.maximum")(is_op("relax.round")(is_op("relax.multiply")(clip1, k)), l2), h2)

    def unclip(expr: relax.Call, m: dict) -> relax.Expr:
        scale = value(m, k).astype(np.float32)
        if not (scale > 0).all():
            return expr
        low = (value(m, l1).astype(np.float32) * scale <= value(m, l2)).all()
        high = (value(m, h1).astype(np.float32) * scale >= value(m, h2)).all()
        if not (low or high):
            return expr
        kept = m[inner]
        if not low:
            kept = relax.op.maximum(kept, m[l1])
        if not high:
            kept = relax.op.minimum(kept, m[h1])
        return relax.op.minimum(relax.op.maximum(relax.op.round(relax.op.multiply(kept, m[k])), m[l2]), m[h2])

    funcs = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for pattern, fold in ((biased, fold_biased), (summed, fold_summed), (twice, fold_twice), (nested, unclip)):
                func = rewrite_call(pattern, fold, func)
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _read_once(func: relax.Function, op_name: str) -> list[relax.Call]:
    """The calls of ``op_name`` in ``func`` whose bound variable is read exactly once."""
    from tuner.graph.pad_fusion import var_reads

    counts = var_reads(func)
    return [b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
            and b.value.op.name == op_name and counts.get(b.var) == 1]  # fmt: skip


def to_int8(mod: tvm.IRModule, bf16_dots: bool = False, pair_limit: bool = False) -> Int8Rewrite:
    """Rewrite a bound QDQ module's dequantize -> conv2d/matmul chains into integer operators;
    with ``bf16_dots`` (the target has a bf16 dot product), a matmul of two quantized
    activations too, exactly, on bf16 dot products (:meth:`_ToInt8._activation_matmul`).
    ``pair_limit``: the target's int8 dot product adds pairs of products in int16 (AVX2's):
    a matmul whose weights could saturate it is not packed for it, and those and such convs
    are counted in the report (``saturating``)."""
    mutator = _ToInt8(mod, bf16_dots, pair_limit)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    report = mutator.report
    report.mod = qdq_as_elementwise(relax.transform.DeadCodeElimination()(mutator.builder_.get()))
    logger.info("%s", report.describe())
    return report
