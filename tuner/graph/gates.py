"""Channel gates kept apart from the convs that compute them.

A squeeze-excitation block scales a feature map by a per-channel gate: ``x * g``, where
``g = hard_sigmoid(conv(relu(conv(mean(x)))))`` has one value a channel. ``FuseOps`` fuses
elementwise and broadcast consumers into a conv's function, so the gate conv takes the
``multiply`` as its epilogue: its output grows from ``C`` values to ``C x H x W``, and the
conv's schedule, made for its own output, is tiled over that large one. In DeepLab-v3's
MobileNet-V3 backbone on an Emerald Rapids the five such functions took 2.8 ms, against
0.2 ms for ONNX Runtime's gate convs and 0.9 ms for all of its ``Mul`` nodes
(``benchmarks/results/op_profile_deeplabv3_mobilenet_v3_large_emeraldrapids.json``).

:func:`gate_vars` finds such gates: values computed from a conv through elementwise ops
alone, with the conv's own shape. :func:`legalize_gate_multiply` legalizes a ``multiply``
that broadcasts a gate over at least :data:`MIN_EXPANSION` times its size as an
*injective* function (``op_pattern`` 2): ``FuseOps`` fuses only elementwise and broadcast
consumers into a conv's function, so the gate conv ends at its activation and the multiply becomes a function of
its own (an elementwise pass over ``x``, as the peers run it). Any other ``multiply``
legalizes as TVM does; the attention mask's ``add`` after a matmul is not a multiply and
keeps its fusion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

import tvm
from tvm import relax, topi
from tvm.ir.expr import Constant

from tuner.graph.layout.legalize import INJECTIVE, _static_shape
from tuner.graph.layout.plan import _CONV2D

#: How many times its own size a gate's broadcast must expand it (the spatial extent of the
#: feature map it scales) before its multiply is kept out of the conv's function.
MIN_EXPANSION = 4


#: How many elementwise ops a gate may be from its conv (bias, the hard-sigmoid's add, clip
#: and divide, a sigmoid).
_MAX_DEPTH = 8


def gate_vars(func: relax.Function) -> frozenset[relax.Var]:
    """The variables of ``func`` bound to a conv's output or to elementwise functions of it
    alone (constants and same-shaped values aside): the gates of squeeze-excitation blocks
    and of any other conv-computed scale."""
    values: dict[relax.Var, relax.Expr] = {}
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.VarBinding):
                values[b.var] = b.value

    def from_conv(var: relax.Var, shape: tuple[int, ...], depth: int) -> bool:
        value = values.get(var)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op) or depth > _MAX_DEPTH:
            return False
        if _static_shape(value) != shape:
            return False
        if value.op.name == _CONV2D:
            return True
        if value.op.name.startswith("relax.nn.conv") or value.op.name == "relax.call_tir":
            return False
        # An elementwise op: its one operand of the gate's shape leads on; any other operand
        # is a constant, inline or bound (a bias, the hard-sigmoid's 3 and 6).
        operands = [a for a in value.args if not isinstance(values.get(a, a), Constant)]
        leads = [a for a in operands if isinstance(a, relax.Var) and _static_shape(a) == shape]
        others = [a for a in operands if a not in leads]
        return len(leads) == 1 and not others and from_conv(leads[0], shape, depth + 1)

    return frozenset(v for v in values if (s := _static_shape(v)) is not None and from_conv(v, s, 0))


def legalize_gate_multiply(gates: Collection[relax.Var]) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    """The legalization of ``multiply`` that keeps a broadcast gate (one of ``gates``, see
    :func:`gate_vars`) out of its conv's function; other multiplies legalize as TVM does."""
    default = tvm.ir.Op.get("relax.multiply").get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        out = _static_shape(call)
        if out is not None and any(_expands(a, out, gates) for a in call.args):
            return bb.call_te(topi.multiply, *call.args, primfunc_name_hint="gate_multiply",
                              primfunc_attrs={"op_pattern": INJECTIVE})  # fmt: skip
        return default(bb, call)

    return legalize


def _expands(arg: relax.Expr, out: tuple[int, ...], gates: Collection[relax.Var]) -> bool:
    shape = _static_shape(arg)
    return (isinstance(arg, relax.Var) and arg in gates and shape is not None
            and math.prod(out) >= MIN_EXPANSION * math.prod(shape))  # fmt: skip
