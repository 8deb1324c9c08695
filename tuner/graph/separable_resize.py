"""Bilinear resizes as two one-axis passes with their coordinates computed once.

TOPI's ``resize2d`` computes every output pixel's source coordinates and weights in float
arithmetic from its indices, and reads four pixels for it: a segmentation head's final
upsampling (DeepLab-v3's 21 x 33 x 33 to 21 x 520 x 520) is compute-bound on that index
arithmetic, and its column gathers keep it from vectorizing. A bilinear resize is separable:
interpolating along the width, then along the height, gives the same value up to float
rounding (TOPI's ``lerp(lerp(top), lerp(bottom))``). :func:`separable_resize2d` computes the
first pass into a small intermediate and the second from it, each output the two neighbours
along its axis times constant weights: indices and weights are computed now, in float32 as
TOPI computes them. The pass that writes the large output reads whole rows at a time (its
index depends on the row only), so it vectorizes along the row. The passes are ordered so
that the first one shrinks the work of the second (width first when upsampling).

:func:`legalize_resize2d` takes the CPU legalization of ``resize2d`` calls with ``linear``
method, ``NCHW`` layout, static float32 shapes, and the ``half_pixel``,
``pytorch_half_pixel``, ``align_corners`` or ``asymmetric`` coordinate modes; any other
resize legalizes as TVM does.
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax, te

from tuner.graph.layout.legalize import _static_shape

logger = logging.getLogger(__name__)

_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def source_coordinates(size: int, out: int, mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output position of one axis: the two input positions it interpolates and the
    weight of the second, as TOPI's ``resize2d`` computes them (float32 coordinates, floor,
    neighbours clamped to the axis)."""
    x = np.arange(out, dtype=np.float32)
    scale = np.float32(size) / np.float32(out)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and out > 1):
        source = (x + np.float32(0.5)) * scale - np.float32(0.5)
    elif mode == "pytorch_half_pixel":
        source = np.zeros_like(x)
    elif mode == "align_corners":
        source = (np.float32(size - 1) / np.float32(max(out - 1, 1))) * x
    elif mode == "asymmetric":
        source = scale * x
    else:
        raise ValueError(f"coordinate mode {mode!r} is not separable here")
    first = np.floor(source)
    weight = (source - first).astype(np.float32)
    lo = np.clip(first.astype(np.int32), 0, size - 1)
    hi = np.clip(first.astype(np.int32) + 1, 0, size - 1)
    return lo, hi, weight


def separable_resize2d(data: te.Tensor, rows: te.Tensor, row_weights: te.Tensor, cols: te.Tensor,
                       col_weights: te.Tensor, width_first: bool) -> te.Tensor:
    """An NCHW bilinear resize as two passes: ``rows`` / ``cols`` hold each output row's /
    column's two source positions (``[2, out]``), ``row_weights`` / ``col_weights`` their
    weights. The first pass (block ``resize_cols`` or ``resize_rows``) writes the
    intermediate, the second (block ``resize2d``) the output."""
    n, c, h, w = data.shape
    oh, ow = int(rows.shape[1]), int(cols.shape[1])

    def at(table: te.Tensor, side: int, pos: tvm.tirx.PrimExpr, size: int) -> tvm.tirx.PrimExpr:
        # Clamped, so any table is safe to run: tuning times the function on random tables.
        return tvm.tirx.max(tvm.tirx.min(table[side, pos], size - 1), 0)

    def along_w(x: te.Tensor, name: str) -> te.Tensor:
        return te.compute((n, c, x.shape[2], ow), lambda b, k, i, j: x[b, k, i, at(cols, 0, j, w)] * col_weights[0, j]
                          + x[b, k, i, at(cols, 1, j, w)] * col_weights[1, j], name=name)  # fmt: skip

    def along_h(x: te.Tensor, name: str) -> te.Tensor:
        return te.compute((n, c, oh, x.shape[3]), lambda b, k, i, j: x[b, k, at(rows, 0, i, h), j] * row_weights[0, i]
                          + x[b, k, at(rows, 1, i, h), j] * row_weights[1, i], name=name)  # fmt: skip

    if width_first:
        return along_h(along_w(data, "resize_cols"), "resize2d")
    return along_w(along_h(data, "resize_rows"), "resize2d")


def _tables(size: int, out: int, mode: str) -> tuple[relax.Constant, relax.Constant]:
    lo, hi, t = source_coordinates(size, out, mode)
    weights = np.stack([np.float32(1.0) - t, t]).astype(np.float32)
    return relax.const(np.stack([lo, hi]).astype(np.int32), "int32"), relax.const(weights, "float32")


def legalize_resize2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A bilinear ``resize2d`` that fits (see the module docstring) as :func:`separable_resize2d`;
    TVM's own legalization otherwise."""
    attrs = call.attrs
    data, out = _static_shape(call.args[0]), _static_shape(call)
    mode = str(attrs.coordinate_transformation_mode)
    if (str(attrs.method) != "linear" or str(attrs.layout) != "NCHW" or mode not in _MODES or data is None
            or out is None or len(data) != 4 or str(call.args[0].ty.dtype) != "float32"
            or str(call.ty.dtype) != "float32"):  # fmt: skip
        return relax.transform.legalize_ops.image._image_resize2d(bb, call)
    (h, w), (oh, ow) = data[2:], out[2:]
    rows, row_weights = _tables(h, oh, mode)
    cols, col_weights = _tables(w, ow, mode)
    # Width first writes C x h x ow, then C x oh x ow; height first C x oh x w, then the same.
    width_first = h * ow <= oh * w
    logger.debug("resize2d %s -> %s: two one-axis passes, %s first", data, out, "width" if width_first else "height")
    return bb.call_te(separable_resize2d, call.args[0], rows, row_weights, cols, col_weights, width_first,
                      primfunc_name_hint="resize2d")  # fmt: skip
