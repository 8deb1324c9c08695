"""Winograd convolution F(m x m, 3 x 3) in the blocked NCHW[x]c layout, for x86 CPUs.

A 3x3 stride-1 conv computes each ``m x m`` tile of its output from an ``(m+2) x (m+2)`` tile
of its input with ``(m+2)^2`` independent GEMMs over the channels instead of ``9 m^2``
multiply-adds per channel pair: 4x fewer multiply-adds for ``m = 4``, 2.25x for ``m = 2``
(Lavin and Gray, 2016). The weights are transformed once, in numpy, at compile time
(:func:`transform_weight`); the function computes

- ``data_pack``: the input tiles transformed, ``V = B^T d B`` (``wino_rows`` is its first,
  row-wise half);
- ``bgemm``: per tile position ``(eps, nu)`` a GEMM ``M = V U`` over the input channels,
  vectorized along the output channel block as the direct conv is;
- ``inverse``: the output tiles, ``Y = A^T M A`` (``wino_inv_rows``: the first half);
- ``conv2d_NCHWc_winograd``: the tiles put back in ``NCHW[x]c`` order, where the epilogue
  (bias, residual add, ReLU) fuses as it does after a direct conv.

The transforms are written out term by term with the matrices' nonzero entries (selected by
the unrolled tile loops), so no multiply by 0 or 1 reaches the code. This is what oneDNN,
NNPACK and TVM's own ``topi`` Winograd compute; the peers' libraries (oneDNN, MLAS) run
direct convs by default, so on these 3x3 convs this is an algorithmic lead, not a tuning one.

Rounding: tests/tuner/test_winograd.py holds each conv to 1e-5 of TOPI's direct conv (of
the largest output); ResNet-50's output differs from ONNX Runtime's by 1.3e-6
(benchmarks/README.md).

In a bf16 model (:mod:`tuner.precision.bf16`) a 3x3 conv runs here in one of two ways:

- F(2, 3) with its GEMMs on ``vdpbf16ps`` (``dot``, :func:`transform_weight_dot`): the
  transformed data and weights are rounded to bf16, the GEMMs sum in float32. This halves the
  GEMMs' work and weight bytes against float32 ones. Its rounding: 1.7-1.8x the largest
  error of the direct bf16 conv on random 64- and 256-channel data (4.2e-3 and 4.6e-3 of the
  largest output, against 2.5e-3 and 2.6e-3); F(4, 3) rounded the same way errs 7.6-8.9x,
  which is why only F(2, 3) runs on the dot product
  (``benchmarks/winograd_bf16_rounding.py``). In ResNet-50 the model's largest error from
  fp32 went from 4.6e-3 to 4.9e-3, top-1 100% of 200 inputs either way. ``data_pack``
  holds the rounded values as their ``uint16`` bits: TVM gives a ``bfloat16`` buffer that a
  function allocates float32 storage, which the instruction cannot read (:mod:`search_spaces.x86.intrin`).
- F(4, 3) in float32 (an explicit ``--layout NCHWc:w4``): it reads the same bf16-rounded
  activation and weights, transformed from their bf16 values and kept float32, so it rounds
  no more than the bf16 direct conv does. Measured on a Zen 4, it did not pay
  (:func:`tuner.graph.layout.plan.auto_layouts`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from tvm import te, tirx, topi
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

from search_spaces.x86.intrin import bf16_bits, bf16_value

# Output tile sizes a plan may ask for.
TILES = (2, 4)
KERNEL = 3
# The tile whose GEMMs run on vdpbf16ps in a bf16 model (see the module's docstring), and the
# input channels one lane of it sums.
DOT_TILE = 2
DOT_PAIR = 2


@functools.cache
def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TVM's Cook-Toom matrices ``(A, B, G)`` of F(m, 3): ``A`` is ``alpha x m``, ``B``
    ``alpha x alpha``, ``G`` ``alpha x 3``, ``alpha = m + 2``."""
    if m not in TILES:
        raise ValueError(f"Winograd tile {m} is not one of {TILES}")
    a, b, g = _cook_toom_convolution(_interpolation_points(m + KERNEL - 2), m, KERNEL)
    return np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64)


def transform_weight(weight: np.ndarray, m: int) -> np.ndarray:
    """``OIHW{i}i{o}o`` 3x3 weights as the GEMMs read them: ``U = G g G^T`` for every
    channel pair, laid out ``(alpha, alpha, O/o, I, o)`` (the output block innermost, a
    vector; the input channel next, the GEMM's reduction)."""
    oc, ic, kh, kw, ib, ob = weight.shape
    if (kh, kw) != (KERNEL, KERNEL):
        raise ValueError(f"Winograd F({m}, 3) needs a 3x3 kernel, got {kh}x{kw}")
    _, _, g = matrices(m)
    w = weight.astype(np.float64).transpose(0, 1, 4, 5, 2, 3)  # (O/o, I/i, i, o, kh, kw)
    u = np.einsum("ek,abcdkl,nl->enabcd", g, w, g, optimize=True)  # (alpha, alpha, O/o, I/i, i, o)
    alpha = m + KERNEL - 1
    return np.ascontiguousarray(u.reshape(alpha, alpha, oc, ic * ib, ob)).astype(weight.dtype)


def transform_weight_dot(weight: np.ndarray, m: int) -> np.ndarray:
    """:func:`transform_weight`'s ``U`` rounded to bf16 and packed for ``vdpbf16ps``:
    ``(alpha, alpha, O/o, I/2, o, 2)``, the two input channels one lane sums adjacent."""
    import ml_dtypes

    u = transform_weight(weight.astype(np.float32), m)
    alpha, _, oc_chunks, channels, ob = u.shape
    if channels % DOT_PAIR:
        raise ValueError(f"a bf16 Winograd GEMM needs an even number of input channels, got {channels}")
    packed = u.reshape(alpha, alpha, oc_chunks, channels // DOT_PAIR, DOT_PAIR, ob).transpose(0, 1, 2, 3, 5, 4)
    return np.ascontiguousarray(packed.astype(ml_dtypes.bfloat16))


def _rows(matrix: np.ndarray, index: tirx.PrimExpr, terms) -> tirx.PrimExpr:
    """``sum_r matrix[r, index] * terms(r)`` over the nonzero entries of column ``index``,
    one expression per value of ``index`` selected by it (the loop over ``index`` is
    unrolled, so each unrolled copy keeps one)."""
    expr = None
    for col in reversed(range(matrix.shape[1])):
        total = None
        for r in range(matrix.shape[0]):
            coef = float(matrix[r, col])
            if coef == 0.0:
                continue
            term = terms(r)
            if coef == -1.0:
                term = -term
            elif coef != 1.0:
                term = term * tirx.const(coef, "float32")
            total = term if total is None else total + term
        total = total if total is not None else tirx.const(0.0, "float32")
        expr = total if expr is None else tirx.Select(index == col, total, expr)
    assert expr is not None
    return expr


def conv2d_nchwc_winograd(data: te.Tensor, kernel: te.Tensor, padding: Sequence[int], m: int,
                          out_dtype: str = "float32") -> te.Tensor:
    """A 3x3 stride-1 conv of ``data`` (``NCHW{i}c``, float32 or bfloat16) by Winograd
    F(m, 3) with float32 weights transformed by :func:`transform_weight`, or bf16 ones by
    :func:`transform_weight_dot` (GEMMs on ``vdpbf16ps``, see the module's docstring); output
    ``NCHW{o}c``. ``padding`` is (top, left, bottom, right)."""
    a_mat, b_mat, _ = matrices(m)
    alpha = m + KERNEL - 1
    n, ic_chunks, h, w, ib = (int(d) for d in data.shape)
    dot = len(kernel.shape) == 6
    if dot:
        _, _, oc_chunks, pairs, ob, _ = (int(d) for d in kernel.shape)
        channels = pairs * DOT_PAIR
        if ib % DOT_PAIR:
            raise ValueError(f"a bf16 Winograd GEMM needs an even input channel block, got {ib}")
    else:
        _, _, oc_chunks, channels, ob = (int(d) for d in kernel.shape)
    if n != 1:
        raise ValueError("the Winograd compute takes batch 1")
    top, left, bottom, right = padding
    oh, ow = h + top + bottom - KERNEL + 1, w + left + right - KERNEL + 1
    nh, nw = -(-oh // m), -(-ow // m)
    tiles = nh * nw
    # Padded so that every tile's input lies inside (the last row and column of tiles may
    # reach past the output; those values are computed and dropped).
    pad = topi.nn.pad(data, [0, 0, top, left, 0],
                      [0, 0, nh * m + 2 - h - top, nw * m + 2 - w - left, 0], name="data_pad")
    def read(p, c, r, j, b):
        # bf16 data (a bf16 model's activation) is widened where it is read: the transforms
        # and the GEMMs run in float32, as for float32 data.
        value = pad[0, c, p // nw * m + r, p % nw * m + j, b]
        return value if str(value.dtype) == "float32" else value.astype("float32")

    rows = te.compute(
        (tiles, ic_chunks, alpha, alpha, ib),
        lambda p, c, eps, j, b: _rows(b_mat, eps, lambda r: read(p, c, r, j, b)),
        name="wino_rows",
    )
    # data_pack holds bf16 bits for the dot product (see the module's docstring).
    store = bf16_bits if dot else (lambda value: value)
    data_pack = te.compute(
        (alpha, alpha, tiles, ic_chunks, ib),
        lambda eps, nu, p, c, b: store(_rows(b_mat, nu, lambda r: rows[p, c, eps, r, b])),
        name="data_pack",
    )
    if dot:
        # Reduction iters as the instruction splits them: the input channel block, its pairs,
        # the two channels of a pair (tensorized with the 16 output lanes).
        rc = te.reduce_axis((0, ic_chunks), name="ic_chunk")
        rg = te.reduce_axis((0, ib // DOT_PAIR), name="ic_group")
        rn = te.reduce_axis((0, DOT_PAIR), name="ic_lane")
        bgemm = te.compute(
            (alpha, alpha, oc_chunks, tiles, ob),
            lambda eps, nu, co, p, k: te.sum(
                bf16_value(data_pack[eps, nu, p, rc, rg * DOT_PAIR + rn])
                * kernel[eps, nu, co, rc * (ib // DOT_PAIR) + rg, k, rn].astype("float32"), axis=[rc, rg, rn]),
            name="bgemm",
        )
    else:
        ci = te.reduce_axis((0, channels), name="ci")
        bgemm = te.compute(
            (alpha, alpha, oc_chunks, tiles, ob),
            lambda eps, nu, co, p, k: te.sum(
                data_pack[eps, nu, p, ci // ib, ci % ib].astype(out_dtype)
                * kernel[eps, nu, co, ci, k].astype(out_dtype), axis=[ci]),
            name="bgemm",
        )
    inv_rows = te.compute(
        (oc_chunks, tiles, m, alpha, ob),
        lambda co, p, vh, nu, k: _rows(a_mat, vh, lambda r: bgemm[r, nu, co, p, k]),
        name="wino_inv_rows",
    )
    inverse = te.compute(
        (oc_chunks, tiles, m, m, ob),
        lambda co, p, vh, vw, k: _rows(a_mat, vw, lambda r: inv_rows[co, p, vh, r, k]),
        name="inverse",
    )
    return te.compute(
        (1, oc_chunks, oh, ow, ob),
        lambda _, co, y, x, k: inverse[co, y // m * nw + x // m, y % m, x % m, k],
        name="conv2d_NCHWc_winograd",
    )
