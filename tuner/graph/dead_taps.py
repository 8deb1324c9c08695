"""Dead kernel taps: a dilated conv's taps that read only padding, cut where they read nothing.

DeepLab's atrous spatial pyramid pools a 33x33 feature map with 3x3 convs of dilation 12, 24
and 36; at dilation 36 every tap but the centre one lands in the zero padding for every output
pixel, so the conv is a 1x1 conv that computes nine times the work. A tap ``k`` of a kernel
axis is dead for output position ``o`` when ``o * stride + k * dilation - pad_before`` falls
outside the input.

Two cuts, both exact:

* A tap dead for every output position (:func:`live_taps`) is cut from the kernel and the
  padding reduced by what it reached, which keeps every output where it was.
* Where a dilated axis has taps dead for only some outputs (dilation 12 or 24 on that 33x33
  map, where 43% and 73% of the multiply-adds read padding), the output is cut into regions
  whose positions read the same live taps (:func:`tap_bands`); each region is a conv of its
  own over the input window it reads, with the kernel cut to its taps, and the regions are
  concatenated back. Only done when the regions skip at least :data:`MIN_SAVING` of the
  multiply-adds: each region is a task of its own to tune.

Only convs whose weights are constants (a bound model's) are cut.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

logger = logging.getLogger(__name__)

#: The share of a conv's multiply-adds that must read padding before it is cut into regions.
MIN_SAVING = 0.4


def live_taps(size: int, out: int, kernel: int, stride: int, dilation: int, pad_before: int) -> range:
    """The taps of one kernel axis that read the input (not only padding) for some output
    position; an empty range when none does."""
    live = [k for k in range(kernel)
            if any(0 <= o * stride + k * dilation - pad_before < size for o in range(out))]  # fmt: skip
    return range(live[0], live[-1] + 1) if live else range(0)


@dataclass(frozen=True)
class Band:
    """Output positions ``outputs`` of one axis that read the same live ``taps``; the input
    window ``start:stop`` they read, which may reach into padding (``start`` < 0 or ``stop`` >
    the input's size)."""

    outputs: range
    taps: range
    start: int
    stop: int


def tap_bands(size: int, out: int, kernel: int, stride: int, dilation: int, pad_before: int) -> list[Band]:
    """One axis's output positions grouped into runs that read the same live taps (the taps of
    one position are contiguous, and the runs are too, since both ends move one way with the
    position). An empty list when some position reads only padding."""
    runs: list[tuple[int, range]] = []  # (first output position, taps)
    for o in range(out):
        live = [k for k in range(kernel) if 0 <= o * stride + k * dilation - pad_before < size]
        if not live:
            return []
        taps = range(live[0], live[-1] + 1)
        if not runs or runs[-1][1] != taps:
            runs.append((o, taps))
    ends = [first for first, _ in runs[1:]] + [out]
    return [_band(range(first, end), taps, stride, dilation, pad_before)
            for (first, taps), end in zip(runs, ends, strict=True)]  # fmt: skip


def _band(outputs: range, taps: range, stride: int, dilation: int, pad_before: int) -> Band:
    """The band of ``outputs`` reading ``taps``, with the input window that takes."""
    start = outputs.start * stride + taps.start * dilation - pad_before
    stop = (outputs.stop - 1) * stride + (taps.stop - 1) * dilation - pad_before + 1
    return Band(outputs, taps, start, stop)


def prune_dead_taps(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every NCHW/OIHW ``conv2d`` that has dead taps (see the module docstring)
    cut to its live taps, by region where that skips enough work; any other conv is kept as
    it is."""
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
    pads = [int(p) for p in attrs.padding]
    axes = [live_taps(data[2 + i], out[2 + i], weight.shape[2 + i], strides[i], dilation[i], pads[i])
            for i in range(2)]  # fmt: skip
    if any(len(taps) == 0 for taps in axes):
        return call  # an all-padding conv is left to TVM
    bands = [_axis_bands(i, data, out, weight.shape, strides, dilation, pads, axes[i]) for i in range(2)]
    if bands[0] and bands[1] and len(bands[0]) * len(bands[1]) > 1:
        macs = sum(len(r.outputs) * len(c.outputs) * len(r.taps) * len(c.taps) for r in bands[0] for c in bands[1])
        saving = 1 - macs / (out[2] * out[3] * weight.shape[2] * weight.shape[3])
        if saving >= MIN_SAVING:
            logger.debug("conv %s: cut into %dx%d regions, %.0f%% of the multiply-adds read padding",
                         data, len(bands[0]), len(bands[1]), 100 * saving)  # fmt: skip
            return _regions(call, weight, bands, data, strides, dilation)
    if all(len(t) == weight.shape[2 + i] for i, t in enumerate(axes)):
        return call  # nothing dead
    window = [_band(range(out[2 + i]), axes[i], strides[i], dilation[i], pads[i]) for i in range(2)]
    new = _conv(call, weight, window, data, strides, dilation)
    logger.debug("conv %s: kernel %sx%s cut to %sx%s (dead taps read only padding)", data,
                 weight.shape[2], weight.shape[3], len(axes[0]), len(axes[1]))  # fmt: skip
    return new


def _axis_bands(axis: int, data: list[int], out: list[int], kshape: tuple[int, ...], strides: list[int],
                dilation: list[int], pads: list[int], live: range) -> list[Band]:  # fmt: skip
    """An axis's bands: by position where the axis is dilated, else one band of its live taps
    (an undilated conv reads padding only at its border: not worth a region)."""
    i = 2 + axis
    if dilation[axis] > 1:
        return tap_bands(data[i], out[i], kshape[i], strides[axis], dilation[axis], pads[axis])
    return [_band(range(out[i]), live, strides[axis], dilation[axis], pads[axis])]


def _conv(call: relax.Call, weight: np.ndarray, window: list[Band], data: list[int], strides: list[int],
          dilation: list[int]) -> relax.Expr:  # fmt: skip
    """The conv of ``call`` over one window per axis (cropped where it lies inside the input,
    padded where it reaches beyond) with the kernel cut to the window's taps."""
    attrs, data_expr = call.attrs, call.args[0]
    begin = [max(w.start, 0) for w in window]
    end = [min(w.stop, data[2 + i]) for i, w in enumerate(window)]
    if begin != [0, 0] or end != data[2:]:
        data_expr = relax.op.strided_slice(data_expr, axes=[2, 3], begin=begin, end=end)
    before = [max(-w.start, 0) for w in window]
    after = [max(w.stop - data[2 + i], 0) for i, w in enumerate(window)]
    rows, cols = window[0].taps, window[1].taps
    cut = np.ascontiguousarray(weight[:, :, rows.start:rows.stop, cols.start:cols.stop])
    return relax.op.nn.conv2d(
        data_expr, relax.const(cut), strides=strides, padding=[before[0], before[1], after[0], after[1]],
        # A one-tap axis reads no neighbour: dilation 1 there keeps its task key a plain one's.
        dilation=[d if len(w.taps) > 1 else 1 for d, w in zip(dilation, window, strict=True)],
        groups=int(attrs.groups), data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
        out_dtype=attrs.out_dtype,
    )  # fmt: skip


def _regions(call: relax.Call, weight: np.ndarray, bands: list[list[Band]], data: list[int],
             strides: list[int], dilation: list[int]) -> relax.Expr:  # fmt: skip
    rows = []
    for r in bands[0]:
        cols = [_conv(call, weight, [r, c], data, strides, dilation) for c in bands[1]]
        rows.append(cols[0] if len(cols) == 1 else relax.op.concat(cols, axis=3))
    return rows[0] if len(rows) == 1 else relax.op.concat(rows, axis=2)
