"""TE computes of the operators the layout rewrite emits: blocked depthwise, grouped and
dot-product convs, row taps, packed matmuls, the fast softmax.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tvm
from tvm import te, topi

from tuner.graph.layout.plan import ROW_TAPS_ATTR

logger = logging.getLogger(__name__)


def _pad_nchwc(data: te.Tensor, window: Sequence[int], strides: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int], name: str) -> tuple[te.Tensor, int, int]:
    """``NCHW{b}c`` data padded by ``padding`` (top, left, bottom, right) in a block ``name``
    (as is when there is none), and the output height and width of a conv over it."""
    _, _, h, w, _ = (int(d) for d in data.shape)
    top, left, bottom, right = padding
    if any(padding):
        data = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name=name)
    oh = (h + top + bottom - (window[0] - 1) * dilation[0] - 1) // strides[0] + 1
    ow = (w + left + right - (window[1] - 1) * dilation[1] - 1) // strides[1] + 1
    return data, oh, ow


def depthwise_conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides: Sequence[int], padding: Sequence[int],
                           dilation: Sequence[int], out_dtype: str) -> te.Tensor:
    """A depthwise conv in ``NCHW{b}c`` with ``OIHW1i{b}o`` weights (channel multiplier 1).

    TOPI 0.27 declares ``depthwise_conv2d_NCHWc`` but registers no compute for it (its x86
    implementation went with ``topi.x86``). ``padding`` is (top, left, bottom, right).
    """
    n, chunks, _, _, block = (int(d) for d in data.shape)
    kh, kw = (int(d) for d in kernel.shape[2:4])
    (sh, sw), (dh, dw) = strides, dilation
    data, oh, ow = _pad_nchwc(data, (kh, kw), strides, padding, dilation, "PaddedInput")
    rh = te.reduce_axis((0, kh), name="kh")
    rw = te.reduce_axis((0, kw), name="kw")
    return te.compute(
        (n, chunks, oh, ow, block),
        lambda b, c, i, j, k: te.sum(
            data[b, c, i * sh + rh * dh, j * sw + rw * dw, k].astype(out_dtype)
            * kernel[c, 0, rh, rw, 0, k].astype(out_dtype), axis=[rh, rw]),
        name="depthwise_conv2d_NCHWc",
    )


def group_conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides: Sequence[int], padding: Sequence[int],
                       dilation: Sequence[int], out_dtype: str) -> te.Tensor:
    """A grouped conv (as many input as output channels) in ``NCHW{b}c`` with weights packed
    by :func:`tuner.graph.layout.packing.pack_group_weight`: ``[C/b, m, KH, KW, b, b]``.

    Output block ``c`` reads the ``m`` input chunks of its group, from chunk ``(c // m) * m``:
    ``m`` is the group's chunks where a group spans whole blocks (ResNeXt's later stages),
    else 1, the block's own chunk, its weights zero across groups. So it is TOPI's
    ``conv2d_NCHWc`` with the input chunks offset per output block (spatial iters n, chunk,
    oh, ow, lane; reduce the fused input channel, kh, kw), and ``x86-conv2d-nchwc``
    schedules it as it does a dense conv. ``padding`` is (top, left, bottom, right)."""
    oc_chunks, m, kh, kw, block, oc_block = (int(d) for d in kernel.shape)
    (sh, sw), (dh, dw) = strides, dilation
    data, oh, ow = _pad_nchwc(data, (kh, kw), strides, padding, dilation, "data_pad")
    ic = te.reduce_axis((0, m * block), name="ic")
    rh, rw = te.reduce_axis((0, kh), name="kh"), te.reduce_axis((0, kw), name="kw")
    return te.compute(
        (int(data.shape[0]), oc_chunks, oh, ow, oc_block),
        lambda b, c, i, j, k: te.sum(
            data[b, (c // m) * m + ic // block, i * sh + rh * dh, j * sw + rw * dw, ic % block].astype(out_dtype)
            * kernel[c, ic // block, rh, rw, ic % block, k].astype(out_dtype), axis=[ic, rh, rw]),
        name="conv2d_NCHWc_grouped",
    )


def row_taps(data: te.Tensor, padding: Sequence[int], kw: int, stride_w: int, block: int) -> te.Tensor:
    """``NCHW{b}c`` data of one chunk as the rows a conv reads along a kernel row: element
    (ih, ow, c t' + t) is the zero-padded input at row ih, column ``ow * stride_w + t``,
    channel c, with ``t' = block // b`` slots a channel (the ``kw`` taps, then zeros), so that
    each channel's taps are neighbouring columns of the image. A conv over it with the
    kernel's rows alone (kh x 1, stride 1 along the row, :func:`row_tap_weight`) is the conv
    over ``data``, each reduction step a whole ``block`` of the taps.

    The block is annotated with :data:`ROW_TAPS_ATTR`: the output columns whose every slot
    lies inside the image, which ``x86-row-taps`` vectorizes (there the bounds check is
    provably true and the slots past the taps are a select, not a branch)."""
    n, _, h, w, b = (int(d) for d in data.shape)
    top, left, bottom, right = padding
    ow = (w + left + right - kw) // stride_w + 1
    slots = block // b
    # Column ow reads image columns ow * stride_w - left + [0, slots).
    first = min(-(-left // stride_w), ow)
    last = max(first, min(ow, (w + left - slots) // stride_w + 1))
    zero = tvm.tirx.const(0, data.dtype)

    def value(i0, i1, i2, i3, i4):
        c, tap = i4 // slots, i4 % slots
        col = i3 * stride_w + tap - left
        inside = tvm.tirx.all(c < b, i2 >= top, i2 < h + top, col >= 0, col < w)
        # Every slot's column is bounds-checked, so the slots past the taps may load.
        return tvm.tirx.if_then_else(inside, tvm.tirx.Select(tap < kw, data[i0, i1, i2 - top, col, c], zero), zero)

    return te.compute((n, 1, h + top + bottom, ow, block), value, name="row_taps",
                      attrs={ROW_TAPS_ATTR: [first, last, slots]})


def conv2d_nchwc_dot(data: te.Tensor, kernel: te.Tensor, strides: Sequence[int], padding: Sequence[int],
                     dilation: Sequence[int], out_dtype: str) -> te.Tensor:
    """A conv in ``NCHW{b}c`` with packed ``OIHW{i/n}i{o}o{n}i`` weights (:func:`pack_dot_weight`),
    summed in ``out_dtype``: TOPI's ``conv2d_NCHWc_int8`` compute (block ``conv2d_NCHWc_dot``)
    without the ``schedule_rule`` annotation for which MetaSchedule has no CPU rule and warns
    on every sketch. ``padding`` is (top, left, bottom, right)."""
    oc_chunks, ic_chunks, kh, kw, groups, oc_block, n = (int(d) for d in kernel.shape)
    (sh, sw), (dh, dw) = strides, dilation
    data, oh, ow = _pad_nchwc(data, (kh, kw), strides, padding, dilation, "data_pad")
    rh, rw = te.reduce_axis((0, kh), name="kh"), te.reduce_axis((0, kw), name="kw")
    rc = te.reduce_axis((0, ic_chunks), name="ic_chunk")
    rg, rn = te.reduce_axis((0, groups), name="ic_group"), te.reduce_axis((0, n), name="ic_lane")
    return te.compute(
        (int(data.shape[0]), oc_chunks, oh, ow, oc_block),
        lambda b, c, i, j, k: te.sum(
            data[b, rc, i * sh + rh * dh, j * sw + rw * dw, rg * n + rn].astype(out_dtype)
            * kernel[c, rc, rh, rw, rg, k, rn].astype(out_dtype), axis=[rh, rw, rc, rg, rn]),
        name="conv2d_NCHWc_dot",
    )


def matmul_packed(a: te.Tensor, w: te.Tensor) -> te.Tensor:
    """``a[..., K] @ W`` for a weight packed by :func:`pack_dense_weight` (block ``matmul``,
    as Relax's own legalization names it, so the tasks keep their names)."""
    _, k_extent, block = (int(d) for d in w.shape)
    k = te.reduce_axis((0, k_extent), name="k")

    def body(*idx):
        j = idx[-1]
        return te.sum(a[(*idx[:-1], k)] * w[j // block, k, j % block], axis=k)

    return te.compute((*a.shape[:-1], int(w.shape[0]) * block), body, name="matmul")


def fast_softmax_last_axis(x: te.Tensor) -> te.Tensor:
    """TOPI's ``fast_softmax`` over the last axis (the same blocks and names), but normalized by
    the reciprocal of each row's sum, ``T_softmax_rcp``, instead of a division per element. On
    an AMX Xeon BERT-base's softmax was its costliest function outside the matmuls, and the
    best ``x86-softmax`` point at its shape took 0.90x the time this way
    (benchmarks/bert_epilogues.py). Within 1e-5 of the exact softmax, as TOPI's
    (tests/tuner/test_layout.py)."""
    *rows, length = x.shape
    k = te.reduce_axis((0, length), name="k")
    maxelem = te.compute(rows, lambda *i: te.max(x(*i, k), axis=k), name="T_softmax_maxelem")
    delta = te.compute(x.shape, lambda *i: x(*i) - maxelem(*i[:-1]), name="T_softmax_delta")
    exp = topi.fast_exp(delta)
    k = te.reduce_axis((0, length), name="k")
    expsum = te.compute(rows, lambda *i: te.sum(exp(*i, k), axis=k), name="T_softmax_expsum")
    rcp = te.compute(rows, lambda *i: tvm.tirx.const(1.0, "float32") / expsum(*i), name="T_softmax_rcp")
    return te.compute(x.shape, lambda *i: exp(*i) * rcp(*i[:-1]), name="T_softmax_norm",
                      attrs={"axis": len(x.shape) - 1})
