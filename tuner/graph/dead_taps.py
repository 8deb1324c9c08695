"""Dead kernel taps: a dilated conv whose outer taps read only padding, cut to the taps that read data.

DeepLab's atrous spatial pyramid pools a 33x33 feature map with 3x3 convs of dilation 12, 24
and 36; at dilation 36 every tap but the centre one lands in the zero padding for every output
pixel, so the conv is a 1x1 conv that computes nine times the work. A tap ``k`` of a kernel
axis is dead when ``o * stride + k * dilation - pad_before`` falls outside the input for every
output position ``o``; the live taps of an axis are contiguous, so the kernel is sliced to
them and the padding reduced by what the cut taps reached, which keeps every output where it
was. Only convs whose weights are constants (a bound model's) are cut.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

logger = logging.getLogger(__name__)


def live_taps(size: int, out: int, kernel: int, stride: int, dilation: int, pad_before: int) -> range:
    """The taps of one kernel axis that read the input (not only padding) for some output
    position; an empty range when none does."""
    live = [k for k in range(kernel)
            if any(0 <= o * stride + k * dilation - pad_before < size for o in range(out))]  # fmt: skip
    return range(live[0], live[-1] + 1) if live else range(0)


def prune_dead_taps(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every NCHW/OIHW ``conv2d`` that has dead taps (see the module docstring)
    rewritten with its kernel cut to the live taps; any other conv is kept as it is."""
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    pattern = is_op("relax.nn.conv2d")(wildcard(), is_const())
    funcs = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            func = rewrite_call(pattern, lambda call, _matches: _cut(call), func)
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _static(expr: relax.Expr) -> list[int] | None:
    shape = getattr(expr.ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return [int(v) for v in values]


def _cut(call: relax.Call) -> relax.Expr:
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return call
    data, out = _static(call.args[0]), _static(call)
    weight = call.args[1].value.numpy()
    if data is None or out is None or weight.ndim != 4:
        return call
    strides = [int(s) for s in attrs.strides]
    dilation = [int(d) for d in attrs.dilation]
    top, left, bottom, right = (int(p) for p in attrs.padding)
    axes = [live_taps(data[2 + i], out[2 + i], weight.shape[2 + i], strides[i], dilation[i], (top, left)[i])
            for i in range(2)]  # fmt: skip
    if any(len(taps) == 0 for taps in axes) or all(len(t) == weight.shape[2 + i] for i, t in enumerate(axes)):
        return call  # nothing dead (or nothing live: an all-padding conv is left to TVM)
    before = [(top, left)[i] - axes[i].start * dilation[i] for i in range(2)]
    after = [(bottom, right)[i] - (weight.shape[2 + i] - axes[i].stop) * dilation[i] for i in range(2)]
    if min(before + after) < 0:
        return call  # the cut would need negative padding (a crop): not worth a special case
    cut = np.ascontiguousarray(weight[:, :, axes[0].start:axes[0].stop, axes[1].start:axes[1].stop])
    new = relax.op.nn.conv2d(
        call.args[0], relax.const(cut), strides=strides,
        padding=[before[0], before[1], after[0], after[1]],
        # A one-tap axis reads no neighbour: dilation 1 there keeps its task key a plain one's.
        dilation=[d if len(t) > 1 else 1 for d, t in zip(dilation, axes, strict=True)],
        groups=int(attrs.groups), data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
        out_dtype=attrs.out_dtype,
    )  # fmt: skip
    logger.debug("conv %s: kernel %sx%s cut to %sx%s (dead taps read only padding)", data,
                 weight.shape[2], weight.shape[3], cut.shape[2], cut.shape[3])  # fmt: skip
    return new
